package dispatcher

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A workspace token is the fleet's own (minted for GitHub events): a
// producer's submission, a schedule's job and a trigger's template that
// carry one are refused, so no tenant hands the worker a credential.
func TestSubmittedWorkspaceTokenRefused(t *testing.T) {
	job := `{"id":"q1","prompt":"hi","workspace":{"repo":"https://git.example/r.git","token":"ghs_x"}}`
	if _, e := decodeJob(protocol.ContentTypeJSON, []byte(job)); e == nil || !strings.Contains(e.Message, "workspace.token") {
		t.Fatalf("submit: %+v", e)
	}
	req := `{"action":"add","tenant":"acme","name":"n","spec":{"every":"1m"},"job":{"prompt":"hi","workspace":{"repo":"https://git.example/r.git","token":"ghs_x"}}}`
	if _, e := decodeSchedule([]byte(req)); e == nil || !strings.Contains(e.Message, "workspace.token") {
		t.Fatalf("schedule: %+v", e)
	}
	if _, err := trigger.Render(json.RawMessage(`{"prompt":"hi","workspace":{"repo":"https://git.example/r.git","token":"{{ .t }}"}}`), "acme", map[string]any{"t": "ghs_x"}); err == nil || !strings.Contains(err.Error(), "workspace.token") {
		t.Fatalf("trigger: %v", err)
	}
	if _, e := decodeJob(protocol.ContentTypeJSON, []byte(strings.Replace(job, `,"token":"ghs_x"`, "", 1))); e != nil {
		t.Fatalf("without a token: %+v", e)
	}
}
