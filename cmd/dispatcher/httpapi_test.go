package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/webhook"
)

// TestServeHTTPAPIAndWebhooks: `dispatcher serve --http --ui-token` serves
// /v1 (the token required, openapi.json open) and delivers webhooks added
// with `tenant webhook add`.
func TestServeHTTPAPIAndWebhooks(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	addr := "127.0.0.1:" + strconv.Itoa(natstest.FreePorts(t, 1)[0])
	start(t, url, "serve", "--http", addr, "--ui-token", "op-secret", "--webhook-allow-private", "--webhook-backoff", "50ms",
		"--storage", "file://"+filepath.Join(f.Dir, "data"))
	base := "http://" + addr
	fleettest.Eventually(t, wait, func() bool {
		r, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	}, "serve ready")

	got := make(chan []byte, 4)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
	}))
	t.Cleanup(rcv.Close)
	code, out, errs := run(t, url, "tenant", "webhook", "add", "default", rcv.URL, "--events", "succeeded")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Regexp(t, regexp.MustCompile(`secret\s+whsec_`), out)

	do := func(method, path, token, body string) (int, []byte) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	st, _ := do(http.MethodGet, "/v1/openapi.json", "", "")
	require.Equal(t, http.StatusOK, st)
	st, _ = do(http.MethodPost, "/v1/queries", "", `{"prompt":"hi"}`)
	require.Equal(t, http.StatusUnauthorized, st)
	st, b := do(http.MethodPost, "/v1/queries", "op-secret", `{"id":"web1","prompt":"hi"}`)
	require.Equal(t, http.StatusAccepted, st, "%s", b)
	st, b = do(http.MethodGet, "/v1/queries/web1/events", "op-secret", "")
	require.Equal(t, http.StatusOK, st)
	require.Contains(t, string(b), "event: message\nid: 1\n")
	require.Contains(t, string(b), `"state":"succeeded"`)

	select {
	case body := <-got:
		var p webhook.Payload
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, "query.succeeded", p.Type)
		require.Equal(t, "web1", p.Data.ID)
	case <-time.After(wait):
		t.Fatal("no webhook")
	}
}
