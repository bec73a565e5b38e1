package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The job field setup travels beside options and is checked: optional,
// UTF-8 without NUL, bounded; a bad one names the field.
func TestJobSetupIsOptionalAndBounded(t *testing.T) {
	var j Job
	require.NoError(t, json.Unmarshal([]byte(`{"id":"q","prompt":"p","options":{},"setup":"# inputs: go.sum\ngo build ./..."}`), &j))
	require.Equal(t, "# inputs: go.sum\ngo build ./...", j.Setup)
	require.NoError(t, j.Validate("acme", true))
	b, err := json.Marshal(&Job{ID: "q", Prompt: "p"})
	require.NoError(t, err)
	require.NotContains(t, string(b), "setup", "absent when empty")

	for name, s := range map[string]string{
		"too long": strings.Repeat("x", MaxSetupBytes+1),
		"nul":      "echo a\x00b",
		"not utf8": "echo \xff",
	} {
		j := Job{ID: "q", Prompt: "p", Setup: s}
		err := j.Validate("acme", true)
		var ve *ValidationError
		require.True(t, errors.As(err, &ve), name)
		require.Equal(t, "setup", ve.Field, name)
	}
}

func TestQuerySetupSubject(t *testing.T) {
	require.Equal(t, "fleet.query.acme.q1.setup", NewNames("").QuerySetup("acme", "q1"))
	require.Equal(t, "setup", CodeSetup, "the documented code")
}
