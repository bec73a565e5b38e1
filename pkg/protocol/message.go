package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Top-level message types an agent writes on stdout (an open set: other
// values are kept and relayed like any other line), plus the worker's own
// x_fleet_* lines.
const (
	TypeSystem          = "system"
	TypeAssistant       = "assistant"
	TypeUser            = "user"
	TypeResult          = "result"
	TypeStreamEvent     = "stream_event"
	TypeRateLimitEvent  = "rate_limit_event"
	TypeToolProgress    = "tool_progress"
	TypeControlRequest  = "control_request"
	TypeControlResponse = "control_response"
	// TypeLineTooLarge is the marker LineReader puts in place of a line over its cap.
	TypeLineTooLarge = "x_fleet_line_too_large"
	// TypeLargeLine is the pointer published on .msg instead of a line too
	// large for one NATS message (docs/protocol.md).
	TypeLargeLine = "x_fleet_large_line"
)

// Result subtypes the CLI is known to write (an open set; success is decided
// by is_error, never by subtype).
const (
	SubtypeSuccess              = "success"
	SubtypeErrorDuringExecution = "error_during_execution"
	SubtypeErrorMaxTurns        = "error_max_turns"
	SubtypeErrorMaxBudgetUSD    = "error_max_budget_usd"
)

// internTypes and internSubtypes map known values to shared strings so that
// parsing a line does not allocate for its type and subtype.
var internTypes, internSubtypes = internTable(
	TypeSystem, TypeAssistant, TypeUser, TypeResult, TypeStreamEvent, TypeRateLimitEvent,
	TypeToolProgress, TypeControlRequest, TypeControlResponse, TypeLineTooLarge, TypeLargeLine,
	"auth_status", "tool_use_summary", "prompt_suggestion", "conversation_reset", "active_goal",
	"control_cancel_request", "keep_alive", "transcript_mirror",
), internTable(
	SubtypeSuccess, SubtypeErrorDuringExecution, SubtypeErrorMaxTurns, SubtypeErrorMaxBudgetUSD,
	"error_max_structured_output_retries", "init", "status", "compact_boundary", "api_retry",
	"hook_started", "hook_progress", "hook_response", "task_started", "task_progress",
	"task_updated", "task_notification", "background_tasks_changed", "thinking_tokens",
	"session_state_changed", "informational", "local_command_output", "notification",
	"permission_denied", "model_refusal_fallback", "model_refusal_no_fallback", "plugin_install",
	"files_persisted", "memory_recall", "elicitation_complete", "commands_changed",
	"control_request_progress", "worker_shutting_down", "mirror_error",
)

func internTable(values ...string) map[string]string {
	m := make(map[string]string, len(values))
	for _, v := range values {
		m[v] = v
	}
	return m
}

// Message is one agent stdout line, kept byte-for-byte, with a parsed header.
type Message struct {
	Raw             []byte // the exact line, without its line terminator
	Type            string // "" when the line is not a JSON object
	Subtype         string
	UUID            string
	SessionID       string
	ParentToolUseID *string
	JSON            bool // the line is a JSON object
}

// Header slots filled by scanObject.
const (
	hType = iota
	hSubtype
	hUUID
	hSessionID
	hParent
	hCount
)

// ParseMessage parses the small header of a line. It never fails: a line that
// is not a JSON object gives a Message with JSON false. Raw aliases line.
//
// One pass over the line both validates it (accepting exactly what
// json.Valid accepts) and notes where the values of the top-level keys type,
// subtype, uuid, session_id and parent_tool_use_id are, wherever they are in
// the object; nested values are checked but not decoded.
// Unknown keys, types and subtypes are fine. A header key holding a value
// that is not a string is treated as absent; parent_tool_use_id null gives a
// nil ParentToolUseID. Header strings are decoded exactly as encoding/json
// would (escapes resolved, invalid UTF-8 replaced). Known types and subtypes
// are interned; uuid and session_id share one allocation.
func ParseMessage(line []byte) Message {
	m := Message{Raw: line}
	var h [hCount][]byte
	if !scanObject(line, &h) {
		return m
	}
	m.JSON = true

	m.Type = internedString(h[hType], internTypes)
	m.Subtype = internedString(h[hSubtype], internSubtypes)

	// uuid, session_id and parent_tool_use_id: plain values are copied into
	// one string; values with escapes or non-ASCII bytes are decoded alone.
	var (
		vals  [3]string
		isStr [3]bool
		plain [3][]byte
		total int
	)
	for k, tok := range [3][]byte{h[hUUID], h[hSessionID], h[hParent]} {
		if len(tok) == 0 || tok[0] != '"' {
			continue
		}
		isStr[k] = true
		if inner, ok := plainString(tok); ok {
			plain[k] = inner
			total += len(inner)
		} else {
			vals[k] = decodeString(tok)
		}
	}
	if total > 0 {
		var sb strings.Builder
		sb.Grow(total)
		for _, p := range plain {
			sb.Write(p)
		}
		all, off := sb.String(), 0
		for k, p := range plain {
			if len(p) > 0 {
				vals[k] = all[off : off+len(p)]
				off += len(p)
			}
		}
	}
	m.UUID, m.SessionID = vals[0], vals[1]
	if isStr[2] {
		parent := vals[2]
		m.ParentToolUseID = &parent
	}
	return m
}

// IsResult reports whether the message is a "result" line.
func (m Message) IsResult() bool { return m.Type == TypeResult }

// Result is the typed view of a result line.
type Result struct {
	Subtype        string          `json:"subtype"`
	IsError        bool            `json:"is_error"`
	Result         *string         `json:"result,omitempty"`
	Errors         []string        `json:"errors,omitempty"`
	NumTurns       int             `json:"num_turns"`
	DurationMS     int64           `json:"duration_ms"`
	TotalCostUSD   float64         `json:"total_cost_usd"`
	SessionID      string          `json:"session_id"`
	TerminalReason string          `json:"terminal_reason,omitempty"`
	Usage          json.RawMessage `json:"usage,omitempty"`
	XFleet         *XFleet         `json:"x_fleet,omitempty"`
}

// Success reports whether the run succeeded: !IsError, whatever the subtype.
func (r *Result) Success() bool { return !r.IsError }

// AsResult decodes the result view; error if the line is not a result.
//
// It returns an error wrapping ErrNotResult when the message is not a JSON
// "result" line. The decode is lenient about drift: a known field holding a
// value of an unexpected type is left at its zero value rather than failing
// the whole line, unless that field is is_error, which decides success.
func (m Message) AsResult() (*Result, error) {
	if !m.JSON || !m.IsResult() {
		return nil, fmt.Errorf("%w: type %q", ErrNotResult, m.Type)
	}
	var r Result
	err := json.Unmarshal(m.Raw, &r)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		var strict struct {
			IsError *bool `json:"is_error"`
		}
		if serr := json.Unmarshal(m.Raw, &strict); serr != nil {
			return nil, fmt.Errorf("protocol: decode result line: %w", serr)
		}
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("protocol: decode result line: %w", err)
	}
	return &r, nil
}

// headerSlot maps a key token (with its quotes) to its header slot, or -1.
func headerSlot(tok []byte) int {
	key, ok := plainString(tok)
	if !ok {
		key = []byte(decodeString(tok)) // escaped key: rare
	}
	switch string(key) {
	case "type":
		return hType
	case "subtype":
		return hSubtype
	case "uuid":
		return hUUID
	case "session_id":
		return hSessionID
	case "parent_tool_use_id":
		return hParent
	}
	return -1
}

// internedString returns the string value of tok ("" if tok is not a JSON
// string), shared with table when it is a known value.
func internedString(tok []byte, table map[string]string) string {
	if len(tok) == 0 || tok[0] != '"' {
		return ""
	}
	inner, ok := plainString(tok)
	if !ok {
		return decodeString(tok)
	}
	if s, found := table[string(inner)]; found {
		return s
	}
	return string(inner)
}

// plainString returns the contents of the string token tok when they need no
// decoding: printable ASCII only, no backslash.
func plainString(tok []byte) ([]byte, bool) {
	inner := tok[1 : len(tok)-1]
	for _, c := range inner {
		if c == '\\' || c >= 0x80 {
			return nil, false
		}
	}
	return inner, true
}

// decodeString decodes a JSON string token the way encoding/json does.
func decodeString(tok []byte) string {
	var s string
	_ = json.Unmarshal(tok, &s) // tok is a valid string token
	return s
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}
