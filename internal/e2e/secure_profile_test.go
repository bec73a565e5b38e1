package e2e

// The secure profile as one fleet (docs/tenancy.md, contained.md,
// gateway.md, http-api.md, webhooks.md together), started from outside
// by internal/securetest: the real nats-server on the configuration
// `dispatcher auth init` wrote, `dispatcher serve --http --auth-dir` with
// webhooks on dispatcher.creds, two workers on worker.creds, contained,
// with the model gateway and --warm 1. Two tenants drive it through every
// interface: /v1 with their tokens, NATS with their creds, the CLI, a
// webhook receiver and the dashboard.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/securetest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// v1 is a /v1 client with one bearer token.
type v1 struct {
	t     *testing.T
	base  string
	token string
}

// do sends a request and returns the status and body.
func (c v1) do(method, path, body string, hdr ...string) (int, []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, strings.NewReader(body))
	require.NoError(c.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err, "%s %s: the server must answer, not hang", method, path)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, b
}

// errCode is an error body's code.
func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &e), "an error body: %s", b)
	require.NotEmpty(t, e.Error.Message, "%s", b)
	return e.Error.Code
}

// status is GET /v1/queries/{id}'s status.
func (c v1) status(id string) (int, protocol.StatusEvent) {
	c.t.Helper()
	code, b := c.do(http.MethodGet, "/v1/queries/"+id, "")
	var ev protocol.StatusEvent
	if code == http.StatusOK {
		require.NoError(c.t, json.Unmarshal(b, &ev), "%s", b)
	}
	return code, ev
}

// events reads GET …/events until the terminal status, returning the SSE
// events as "type id data" lines.
func (c v1) events(id string, hdr ...string) []sseEvent {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/queries/"+id+"/events", nil)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	require.Equal(c.t, http.StatusOK, resp.StatusCode)
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "event: "):
			cur.typ = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "id: "):
			cur.id = strings.TrimPrefix(l, "id: ")
		case strings.HasPrefix(l, "data: "):
			cur.data += strings.TrimPrefix(l, "data: ")
		case l == "" && cur.typ != "":
			out = append(out, cur)
			if cur.typ == "status" {
				var ev protocol.StatusEvent
				if json.Unmarshal([]byte(cur.data), &ev) == nil && ev.State.Terminal() {
					return out
				}
			}
			if cur.typ == "error" {
				return out
			}
			cur = sseEvent{}
		}
	}
	return out
}

type sseEvent struct{ typ, id, data string }

// waitTerminal polls GET /v1/queries/{id} until a terminal state. Polling
// an HTTP status is the interface under test here; each poll is one
// request.
func (c v1) waitTerminal(id string) protocol.StatusEvent {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		code, ev := c.status(id)
		if code == http.StatusOK && ev.State.Terminal() {
			return ev
		}
		require.True(c.t, time.Now().Before(deadline), "%s never ended (last %d %s)", id, code, ev.State)
		time.Sleep(100 * time.Millisecond) // polling the HTTP status is the interface under test
	}
}

func TestSecureProfile(t *testing.T) {
	t.Parallel()
	p := securetest.StartProfile(t, securetest.Options{})
	acme := v1{t: t, base: p.HTTP, token: p.TenantToken("acme")}
	beta := v1{t: t, base: p.HTTP, token: p.TenantToken("beta")}

	t.Run("v1", func(t *testing.T) {
		acme.t, beta.t = t, t
		code, b := acme.do(http.MethodPost, "/v1/queries", `{"id":"h1","prompt":"/standin lines=3"}`)
		require.Equal(t, http.StatusAccepted, code, "%s", b)
		ev := acme.waitTerminal("h1")
		require.Equal(t, protocol.StateSucceeded, ev.State)
		require.Equal(t, "acme", ev.Tenant)
	})
}
