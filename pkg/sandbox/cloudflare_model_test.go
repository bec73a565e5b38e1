package sandbox_test

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

const cfModelKey = "sk-ant-bridge-secret-for-tests"

// cfModelCall runs curl in the sandbox against its model egress (a streamed
// Messages call with whatever credential the process holds) and returns its
// output: the HTTP status on the last line.
func cfModelCall(t *testing.T, sb sandbox.Sandbox, id string) string {
	t.Helper()
	script := `curl -sS -N -H "x-api-key: $ANTHROPIC_API_KEY" -H 'content-type: application/json' ` +
		`-d '{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"Bash","input_schema":{"type":"object"}}]}' ` +
		`-w '\n%{http_code}' "$ANTHROPIC_BASE_URL/v1/messages"; echo; env`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: id, Argv: []string{"sh", "-c", script}})
	require.NoError(t, err)
	out, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	st, err := p.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, string(out))
	return string(out)
}

func cfStatusOf(out string) string {
	head, _, _ := strings.Cut(out, "\nANTHROPIC") // env follows the status line
	lines := strings.Fields(head)
	for i := len(lines) - 1; i >= 0; i-- {
		if len(lines[i]) == 3 && lines[i][0] >= '1' && lines[i][0] <= '5' {
			return lines[i]
		}
	}
	return ""
}

// TestCloudflareModelRun: a sandbox's model calls go through the bridge's
// metered egress: 401 before a run is open, forwarded with the bridge's
// key (never the process's) and metered once it is, reported with the
// query's call numbers from a cursor, refused with 402 past the cap, and
// 401 again once closed.
func TestCloudflareModelRun(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed: the test's sandboxed process makes its model calls with it")
	}
	api := anthropicfake.New(t, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("hello")},
			Usage: &anthropicfake.Usage{InputTokens: 1000, OutputTokens: 500}}
	})
	b := setupCloudflare(t, bridgefake.Options{ModelUpstream: api.URL, ModelAPIKey: cfModelKey}, sandbox.CloudflareConfig{})
	ctx := context.Background()
	sb, err := b.cf.Create(ctx, sandbox.Spec{ID: "model-run-1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	mm, ok := sb.(sandbox.ModelMetered)
	require.True(t, ok, "a Cloudflare sandbox is ModelMetered")

	_, err = mm.ModelCalls(ctx, 0)
	require.ErrorIs(t, err, sandbox.ErrNotFound)
	out := cfModelCall(t, sb, "p0")
	require.Equal(t, "401", cfStatusOf(out), out)
	require.Empty(t, api.Requests(), "nothing is forwarded without a run")

	// $0.003 input + $0.0075 output per call at claude-sonnet-4-5's prices.
	// The bridge is unavailable twice first: the open is retried.
	b.fake.FailModel(2)
	require.NoError(t, mm.OpenModelRun(ctx, sandbox.ModelRun{Tenant: "acme", QueryID: "q1", Attempt: 2, FirstCall: 3, MaxCostUSD: 0.02, SpentUSD: 0.005}))
	out = cfModelCall(t, sb, "p1")
	require.Equal(t, "200", cfStatusOf(out), out)
	require.Contains(t, out, "message_start")
	require.NotContains(t, out, cfModelKey, "the key never reaches the sandbox")
	require.Contains(t, out, "ANTHROPIC_API_KEY="+bridgefake.CredentialPlaceholder)
	reqs := api.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, cfModelKey, reqs[0].Header.Get("X-Api-Key"), "the bridge adds its own key at egress")

	b.fake.FailModel(1)
	rep, err := mm.ModelCalls(ctx, 0)
	require.NoError(t, err, "a read is retried too")
	require.Len(t, rep.Calls, 1)
	c := rep.Calls[0]
	require.Equal(t, 3, c.Call)
	require.Equal(t, 2, c.Attempt)
	require.Equal(t, int64(1000), c.InputTokens)
	require.Equal(t, int64(500), c.OutputTokens)
	require.Equal(t, 200, c.Status)
	require.InDelta(t, 0.0105, c.CostUSD, 1e-9)
	require.Equal(t, 1, rep.Next)
	require.InDelta(t, 0.0155, rep.SpentUSD, 1e-9)
	require.False(t, rep.Capped)

	out = cfModelCall(t, sb, "p2") // crosses the cap: $0.026 of $0.02
	require.Equal(t, "200", cfStatusOf(out), out)
	rep, err = mm.ModelCalls(ctx, rep.Next)
	require.NoError(t, err)
	require.Len(t, rep.Calls, 1)
	require.Equal(t, 4, rep.Calls[0].Call)
	require.True(t, rep.Capped)
	out = cfModelCall(t, sb, "p3")
	require.Equal(t, "402", cfStatusOf(out), out)
	require.Contains(t, out, "billing_error")
	require.Len(t, api.Requests(), 2, "a call past the cap is not forwarded")

	last, err := mm.CloseModelRun(ctx, 2)
	require.NoError(t, err)
	require.Empty(t, last.Calls, "a refused call is no call")
	require.True(t, last.Capped)
	out = cfModelCall(t, sb, "p4")
	require.Equal(t, "401", cfStatusOf(out), out)
	_, err = mm.CloseModelRun(ctx, 0)
	require.True(t, errors.Is(err, sandbox.ErrNotFound), "%v", err)
}

// TestCloudflareModelRunInvalid: a bad run is refused before any request.
func TestCloudflareModelRunInvalid(t *testing.T) {
	b := setupCloudflare(t, bridgefake.Options{}, sandbox.CloudflareConfig{})
	sb, err := b.cf.Create(context.Background(), sandbox.Spec{ID: "model-run-2"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	mm := sb.(sandbox.ModelMetered)
	for _, r := range []sandbox.ModelRun{{QueryID: "q", FirstCall: 1}, {Tenant: "t", QueryID: "q"}, {Tenant: "t", QueryID: "q", FirstCall: 1, MaxCostUSD: -1}} {
		require.ErrorIs(t, mm.OpenModelRun(context.Background(), r), sandbox.ErrInvalid)
	}
	_, err = mm.ModelCalls(context.Background(), -1)
	require.ErrorIs(t, err, sandbox.ErrInvalid)
}
