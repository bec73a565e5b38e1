package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// keys decodes a JSON object's top level, to see which fields are present.
func keys(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func TestTerminalSummariesHoldEveryFieldFalseAndZeroIncluded(t *testing.T) {
	t.Parallel()
	ev := StatusEvent{
		V: SchemaVersion, ID: "q1", Tenant: "acme", State: StateSucceeded, Attempt: 1,
		Result:    &ResultSummary{Subtype: "success"},
		Workspace: &WorkspaceStatus{StartSHA: "a1", EndSHA: "a1"}, // nothing changed, not pushed
	}
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	top := keys(t, b)
	ws := keys(t, top["workspace"])
	for _, k := range []string{"start_sha", "end_sha", "files_changed", "additions", "deletions", "pushed"} {
		require.Contains(t, ws, k, "workspace summary %s", b)
	}
	require.JSONEq(t, "false", string(ws["pushed"]))
	require.JSONEq(t, "0", string(ws["files_changed"]))
	require.NotContains(t, ws, "push_error")
	res := keys(t, top["result"])
	for _, k := range []string{"subtype", "is_error", "num_turns", "duration_ms", "total_cost_usd"} {
		require.Contains(t, res, k, "result summary %s", b)
	}
	require.JSONEq(t, "0", string(res["total_cost_usd"]))

	// Decoding gives back what was encoded.
	var back StatusEvent
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, *ev.Workspace, *back.Workspace)
	require.Equal(t, ev.Result.Subtype, back.Result.Subtype)
}

func TestARunningWorkspaceNamesOnlyItsStart(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(&WorkspaceStatus{StartSHA: "a1"})
	require.NoError(t, err)
	require.JSONEq(t, `{"start_sha":"a1"}`, string(b))
}

func TestAFailedCaptureIsASummaryToo(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(WorkspaceStatus{StartSHA: "a1", Branch: "fleet/q1", CaptureError: "disk full"})
	require.NoError(t, err)
	ws := keys(t, b)
	require.JSONEq(t, "false", string(ws["pushed"]))
	require.JSONEq(t, `"disk full"`, string(ws["capture_error"]))
}
