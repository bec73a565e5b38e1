package render

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestResultOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, line, want string
	}{
		{"an is_error result with subtype success is the agent's error",
			`{"type":"result","subtype":"success","is_error":true,"result":"API Error: 500","num_turns":1}`,
			"✗ failed (the agent reported an error) · turns 1 · cost $0.0000 · 0.0s\n  API Error: 500\n"},
		{"a cancel is not a failure",
			string(protocol.SyntheticResult(protocol.SyntheticInput{Reason: protocol.ReasonCancelled, Message: "cancelled by request"})),
			"✗ cancelled · "},
		{"a worker failure names its reason",
			string(protocol.SyntheticResult(protocol.SyntheticInput{Reason: protocol.ReasonProcessExit, Message: "exit 2"})),
			"✗ failed (worker: process_exit) · "},
		{"max turns", `{"type":"result","subtype":"error_max_turns","is_error":true}`, "✗ failed (max turns reached) · "},
		{"success", `{"type":"result","subtype":"success","is_error":false,"num_turns":2,"total_cost_usd":0.5}`, "✓ done · turns 2 · cost $0.5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			(&Printer{W: &b}).Line([]byte(tc.line))
			require.Contains(t, b.String(), tc.want)
		})
	}
}

func TestColor(t *testing.T) {
	t.Parallel()
	var plain, col bytes.Buffer
	ev := protocol.StatusEvent{State: protocol.StateFailed, Attempt: 1}
	(&Printer{W: &plain}).Status(ev)
	(&Printer{W: &col, Color: true}).Status(ev)
	require.Equal(t, "[status] failed · attempt 1\n", plain.String())
	require.Equal(t, "\x1b[31m[status] failed · attempt 1\x1b[0m\n", col.String())
}

// The agent's stderr tail of a synthetic result is shown: it is often the
// only reason there is.
func TestSyntheticResultShowsStderrTail(t *testing.T) {
	t.Parallel()
	code := 1
	stderr := "warming up\n" + strings.Repeat("noise\n", 20) +
		"Error: --dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons\n"
	line := protocol.SyntheticResult(protocol.SyntheticInput{Reason: protocol.ReasonProcessExit, ExitCode: &code, StderrTail: stderr})
	var b bytes.Buffer
	(&Printer{W: &b}).Line(line)
	out := b.String()
	require.Contains(t, out, "✗ failed (worker: process_exit)")
	require.Contains(t, out, "agent stderr (last 12 lines):\n")
	require.Contains(t, out, "  | Error: --dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons\n")
	require.NotContains(t, out, "warming up", "only the last lines")
	require.Equal(t, 12, strings.Count(out, "  | "))

	b.Reset()
	(&Printer{W: &b}).Line(protocol.SyntheticResult(protocol.SyntheticInput{Reason: protocol.ReasonProcessExit, ExitCode: &code}))
	require.NotContains(t, b.String(), "stderr", "nothing when stderr was empty")
}
