package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func triggerRequest(t *testing.T, f *fleettest.Fleet, req trigger.Request) trigger.Reply {
	t.Helper()
	b, _ := json.Marshal(req)
	m, err := f.NC.Request(trigger.Subject(f.Names), b, 30*time.Second)
	require.NoError(t, err)
	var rep trigger.Reply
	require.NoError(t, json.Unmarshal(m.Data, &rep))
	return rep
}

// post signs body with secret as webhook id and posts it.
func postSigned(t *testing.T, url, secret, id string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	if secret != "" {
		wh, err := standardwebhooks.NewWebhook(secret)
		require.NoError(t, err)
		now := time.Now()
		sig, err := wh.Sign(id, now, body)
		require.NoError(t, err)
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strings.TrimSpace(jsonInt(now.Unix())))
		req.Header.Set("webhook-signature", sig)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func jsonInt(i int64) string { b, _ := json.Marshal(i); return string(b) }

// TestInboundTriggerStartsOneJobPerWebhook: a signed POST starts the
// template's job with the body's fields in it (never in the job's
// structure), a replay of the webhook id starts nothing new, and bad
// signatures, unknown triggers, non-object and oversized bodies are
// refused with nothing enqueued.
func TestInboundTriggerStartsOneJobPerWebhook(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	srv := httptest.NewServer(f.Disp.Inbound(http.NotFoundHandler()))
	t.Cleanup(srv.Close)

	tmpl := `{"prompt":"Deploy {{ .service }} at {{ .version }}","metadata":{"service":"{{ .service }}"},"options":{"max_turns":2}}`
	rep := triggerRequest(t, f, trigger.Request{Action: "add", Tenant: "acme", Name: "deploy", Template: json.RawMessage(tmpl)})
	require.Nil(t, rep.Error)
	secret := rep.Triggers[0].Secret
	require.True(t, strings.HasPrefix(secret, "whsec_"))
	require.Equal(t, "/v1/triggers/acme/deploy", rep.Triggers[0].Path)
	url := srv.URL + rep.Triggers[0].Path

	// A field that tries to break out of its string stays in it.
	body := []byte(`{"service":"api\",\"tenant\":\"other","version":7}`)
	code, out := postSigned(t, url, secret, "msg_1", body)
	require.Equal(t, http.StatusAccepted, code, "%v", out)
	id := out["id"].(string)
	require.Equal(t, trigger.JobID("deploy", "msg_1"), id)
	r := f.Follow("acme", id, wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, &protocol.Trigger{Kind: protocol.TriggerWebhook, Name: "deploy", Delivery: "msg_1"}, r.Final.Trigger)
	require.Equal(t, `api","tenant":"other`, r.Final.Metadata["service"])
	require.Equal(t, `Deploy api","tenant":"other at 7`, r.Final.Prompt)

	// The same webhook again: nothing new.
	code, out = postSigned(t, url, secret, "msg_1", body)
	require.Equal(t, http.StatusAccepted, code)
	require.Equal(t, id, out["id"])
	require.Equal(t, true, out["duplicate"])

	for _, c := range []struct {
		name, url, secret string
		body              []byte
		want              int
	}{
		{"wrong secret", url, "whsec_" + strings.Repeat("QUFB", 8), []byte(`{"service":"x"}`), http.StatusUnauthorized},
		{"unsigned", url, "", []byte(`{"service":"x"}`), http.StatusUnauthorized},
		{"unknown trigger", srv.URL + "/v1/triggers/acme/nope", secret, []byte(`{}`), http.StatusNotFound},
		{"other tenant's path", srv.URL + "/v1/triggers/other/deploy", secret, []byte(`{}`), http.StatusNotFound},
		{"not an object", url, secret, []byte(`["x"]`), http.StatusBadRequest},
		{"too large", url, secret, append(append([]byte(`{"service":"`), bytes.Repeat([]byte("a"), trigger.MaxBody)...), '"', '}'), http.StatusRequestEntityTooLarge},
	} {
		code, out := postSigned(t, c.url, c.secret, "msg_"+c.name, c.body)
		require.Equal(t, c.want, code, "%s: %v", c.name, out)
	}
	// Nothing but the one job was queued for acme.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var lr protocol.APIReply
	fleettest.Eventually(t, wait, func() bool { // the status index lags the statuses
		var err error
		lr, err = f.Client.List(ctx, protocol.ListRequest{Tenant: "acme"})
		return err == nil && len(lr.Queries) > 0
	}, "acme's job in the list")
	require.Len(t, lr.Queries, 1)
	require.Equal(t, id, lr.Queries[0].ID)

	// A template that is not a job is refused at add, naming why.
	rep = triggerRequest(t, f, trigger.Request{Action: "add", Tenant: "acme", Name: "bad", Template: json.RawMessage(`{"prompt":"p","colour":"red"}`)})
	require.NotNil(t, rep.Error)
	require.Equal(t, protocol.CodeInvalidJob, rep.Error.Code)
	require.Contains(t, rep.Error.Message, "colour")

	// ls hides secrets; rm removes.
	rep = triggerRequest(t, f, trigger.Request{Action: "ls", Tenant: "acme"})
	require.Len(t, rep.Triggers, 1)
	require.Empty(t, rep.Triggers[0].Secret)
	rep = triggerRequest(t, f, trigger.Request{Action: "rm", Tenant: "acme", Name: "deploy"})
	require.Nil(t, rep.Error)
	code, _ = postSigned(t, url, secret, "msg_2", body)
	require.Equal(t, http.StatusNotFound, code)
}

// TestTriggerCLI: tenant trigger add prints the URL and secret once; ls
// and rm.
func TestTriggerCLI(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	file := filepath.Join(t.TempDir(), "job.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"prompt":"Handle {{ .event }}"}`), 0o600))
	code, out, errOut := runCLI(t, url, "", "tenant", "trigger", "add", "acme", "hook", "--template", file, "--url", "https://fleet.example.com")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "https://fleet.example.com/v1/triggers/acme/hook")
	require.Contains(t, out, "whsec_")
	code, out, errOut = runCLI(t, url, "", "tenant", "trigger", "ls", "acme")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "hook")
	require.NotContains(t, out, "whsec_")
	code, _, _ = runCLI(t, url, "", "tenant", "trigger", "add", "acme", "hook", "--template", file)
	require.Equal(t, 6, code, "a name in use is refused")
	code, _, errOut = runCLI(t, url, "", "tenant", "trigger", "rm", "acme", "hook")
	require.Equal(t, 0, code, errOut)
	code, _, _ = runCLI(t, url, "", "tenant", "trigger", "rm", "acme", "hook")
	require.Equal(t, 3, code)
}
