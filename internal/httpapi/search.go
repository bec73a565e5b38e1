package httpapi

import (
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// MaxQuery is the longest ?q= search text.
const MaxQuery = 200

// Matches reports whether a status record matches the search text q: q
// (case-insensitive) is part of its id, of its prompt (the start the
// statuses carry, protocol.PromptPreview), of a metadata key or value, of
// its error's code or message, or of its result's errors. "" matches every
// record.
func Matches(ev protocol.StatusEvent, q string) bool {
	if q == "" {
		return true
	}
	q = strings.ToLower(q)
	has := func(s string) bool { return strings.Contains(strings.ToLower(s), q) }
	if has(ev.ID) || has(ev.Prompt) {
		return true
	}
	for k, v := range ev.Metadata {
		if has(k) || has(v) {
			return true
		}
	}
	if ev.Error != nil && (has(ev.Error.Code) || has(ev.Error.Message)) {
		return true
	}
	return ev.Result != nil && slices.ContainsFunc(ev.Result.Errors, has)
}
