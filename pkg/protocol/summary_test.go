package protocol

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

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

// The summaries' encoders list their fields by hand: a field added to the
// type must be added there too, or it would vanish from the wire.
func TestSummaryEncodersKeepEveryField(t *testing.T) {
	t.Parallel()
	for _, v := range []any{&ResultSummary{}, &WorkspaceStatus{}} {
		rv := reflect.ValueOf(v).Elem()
		want := map[string]bool{}
		for i := 0; i < rv.NumField(); i++ {
			f := rv.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || name == "" {
				continue
			}
			want[name] = true
			switch fv := rv.Field(i); fv.Kind() {
			case reflect.String:
				fv.SetString("x")
			case reflect.Bool:
				fv.SetBool(true)
			case reflect.Int, reflect.Int64:
				fv.SetInt(1)
			case reflect.Uint64:
				fv.SetUint(1)
			case reflect.Float64:
				fv.SetFloat(1)
			case reflect.Slice:
				if f.Type == reflect.TypeOf(json.RawMessage(nil)) {
					fv.SetBytes([]byte(`{"n":1}`))
				} else {
					fv.Set(reflect.ValueOf([]string{"x"}))
				}
			default:
				t.Fatalf("%T.%s: teach this test its kind %s", v, f.Name, fv.Kind())
			}
		}
		b, err := json.Marshal(v)
		require.NoError(t, err)
		got := keys(t, b)
		for name := range want {
			require.Contains(t, got, name, "%T drops %s: add it to its MarshalJSON", v, name)
		}
	}
}

func TestPromptPreviewCutsAtARuneBoundary(t *testing.T) {
	t.Parallel()
	require.Equal(t, "short", PromptPreview("short"))
	long := strings.Repeat("é", PromptPreviewBytes) // two bytes each
	p := PromptPreview(long)
	require.True(t, utf8.ValidString(p), p)
	require.True(t, strings.HasSuffix(p, "…"))
	require.LessOrEqual(t, len(p), PromptPreviewBytes+len("…"))
}
