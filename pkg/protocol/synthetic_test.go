package protocol

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

var uuidV4RE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestSyntheticResultExactShape(t *testing.T) {
	t.Parallel()
	line := SyntheticResult(SyntheticInput{
		Reason: ReasonCancelled, ExitCode: ptr(137), Signal: "SIGKILL", StderrTail: "bye <&>\n",
		DurationMS: 1500, SessionID: "s-1", NumTurns: 2, Message: "worker: cancelled by user",
	})
	m := ParseMessage(line)
	require.True(t, uuidV4RE.MatchString(m.UUID), m.UUID)
	want := `{"type":"result","subtype":"error_during_execution","is_error":true,"duration_ms":1500,` +
		`"duration_api_ms":0,"num_turns":2,"stop_reason":null,"session_id":"s-1","total_cost_usd":0,` +
		`"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},` +
		`"modelUsage":{},"permission_denials":[],"errors":["worker: cancelled by user"],` +
		`"terminal_reason":"aborted_streaming","uuid":"` + m.UUID + `",` +
		`"x_fleet":{"synthetic":true,"reason":"cancelled","exit_code":137,"signal":"SIGKILL","stderr_tail":"bye <&>\n"}}`
	require.Equal(t, want, string(line))
}

func TestSyntheticResultReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		in          SyntheticInput
		wantReason  string
		wantMessage string // substring of errors[0]
	}{
		{name: "cancelled", in: SyntheticInput{Reason: ReasonCancelled, Signal: "SIGKILL", ExitCode: nil},
			wantReason: ReasonCancelled, wantMessage: "cancelled (signal SIGKILL)"},
		{name: "timeout", in: SyntheticInput{Reason: ReasonTimeout, ExitCode: ptr(-1), Signal: "SIGKILL"},
			wantReason: ReasonTimeout, wantMessage: "timed out (exit code -1, signal SIGKILL)"},
		{name: "process exit", in: SyntheticInput{Reason: ReasonProcessExit, ExitCode: ptr(1), StderrTail: "Error: boom"},
			wantReason: ReasonProcessExit, wantMessage: "exited (exit code 1)"},
		{name: "spawn failed", in: SyntheticInput{Reason: ReasonSpawnFailed, Message: "exec: claude: not found"},
			wantReason: ReasonSpawnFailed, wantMessage: "exec: claude: not found"},
		{name: "output too large", in: SyntheticInput{Reason: ReasonOutputTooLarge, ExitCode: ptr(0)},
			wantReason: ReasonOutputTooLarge, wantMessage: "exceeded a hard limit"},
		{name: "max deliveries", in: SyntheticInput{Reason: ReasonMaxDeliveries},
			wantReason: ReasonMaxDeliveries, wantMessage: "dead-lettered"},
		{name: "empty reason means process exit", in: SyntheticInput{},
			wantReason: ReasonProcessExit, wantMessage: "the agent exited before"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line := SyntheticResult(tt.in)
			require.True(t, json.Valid(line))
			require.NotContains(t, string(line), "\n")

			m := ParseMessage(line)
			require.True(t, m.JSON)
			require.True(t, m.IsResult())
			require.Equal(t, SubtypeErrorDuringExecution, m.Subtype)
			require.True(t, uuidV4RE.MatchString(m.UUID), m.UUID)

			r, err := m.AsResult()
			require.NoError(t, err)
			require.True(t, r.IsError)
			require.False(t, r.Success())
			require.Nil(t, r.Result)
			require.NotNil(t, r.XFleet)
			require.True(t, r.XFleet.Synthetic)
			require.Equal(t, tt.wantReason, r.XFleet.Reason)
			require.Equal(t, tt.in.ExitCode, r.XFleet.ExitCode)
			require.Equal(t, tt.in.Signal, r.XFleet.Signal)
			require.Equal(t, tt.in.StderrTail, r.XFleet.StderrTail)
			require.Len(t, r.Errors, 1)
			require.Contains(t, r.Errors[0], tt.wantMessage)
			require.Zero(t, r.TotalCostUSD)
			if tt.wantReason == ReasonCancelled {
				require.Equal(t, "aborted_streaming", r.TerminalReason)
			} else {
				require.Empty(t, r.TerminalReason)
				require.NotContains(t, string(line), "terminal_reason")
			}

			// The SDK result shape: every field of SDKResultError is present.
			var obj map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(line, &obj))
			for _, key := range []string{"type", "subtype", "is_error", "duration_ms", "duration_api_ms", "num_turns",
				"stop_reason", "session_id", "total_cost_usd", "usage", "modelUsage", "permission_denials", "errors", "uuid", "x_fleet"} {
				require.Contains(t, obj, key)
			}
			var xf map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(obj["x_fleet"], &xf))
			if tt.in.ExitCode == nil {
				require.Equal(t, "null", string(xf["exit_code"]))
			}
			if tt.in.Signal == "" {
				require.Equal(t, "null", string(xf["signal"]))
			}
		})
	}
}

func TestSyntheticResultSanitizesUTF8(t *testing.T) {
	t.Parallel()
	line := SyntheticResult(SyntheticInput{Reason: ReasonProcessExit, StderrTail: "bad \xff\xfe bytes \xe2\x82", Message: "m\xc3", SessionID: "s\xff"})
	require.True(t, utf8.Valid(line), "the line must be valid UTF-8")
	r, err := ParseMessage(line).AsResult()
	require.NoError(t, err)
	require.Equal(t, "bad \uFFFD bytes \uFFFD", r.XFleet.StderrTail)
	require.Equal(t, "m\uFFFD", r.Errors[0])
}

func TestSyntheticResultStderrTailIsCut(t *testing.T) {
	t.Parallel()
	stderr := "start " + strings.Repeat("é", MaxStderrTail) + " the end"
	line := SyntheticResult(SyntheticInput{StderrTail: stderr})
	r, err := ParseMessage(line).AsResult()
	require.NoError(t, err)
	tail := r.XFleet.StderrTail
	require.LessOrEqual(t, len(tail), MaxStderrTail)
	require.Greater(t, len(tail), MaxStderrTail-utf8.UTFMax)
	require.True(t, strings.HasSuffix(stderr, tail), "keeps the end of stderr, cut on a rune boundary")
	require.NotContains(t, tail, "\uFFFD")
}

func TestSyntheticResultFreshUUID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		u := ParseMessage(SyntheticResult(SyntheticInput{})).UUID
		require.False(t, seen[u], "uuid repeated")
		seen[u] = true
	}
}

func TestSyntheticResultClampsNegatives(t *testing.T) {
	t.Parallel()
	r, err := ParseMessage(SyntheticResult(SyntheticInput{DurationMS: -5, NumTurns: -1})).AsResult()
	require.NoError(t, err)
	require.Zero(t, r.DurationMS)
	require.Zero(t, r.NumTurns)
}
