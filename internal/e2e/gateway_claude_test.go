package e2e

// The model gateway in the worker (docs/gateway.md), with the real Claude Code CLI
// talking to the fake Anthropic API through it: the fake sees only the
// worker's key, the agent holds only its run's token, every call has its
// .model event, the terminal status reports their sum, and a cap stops a
// session mid-way.

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// gwKey is the worker's (real-looking) model key; the test builds it so
// that no command line or transcript holds it whole.
var gwKey = "sk-ant-api03-" + strings.Repeat("Gw7", 30) + "-Zq9K" + "v7Wm"

// gwBundle is a fleet whose worker runs Claude Code behind a gateway to the
// fake.
type gwBundle struct {
	f    *fleettest.Fleet
	fake *anthropicfake.Server
	gw   *gateway.Gateway
}

func setupGateway(t *testing.T, reply anthropicfake.ReplyFunc) *gwBundle {
	t.Helper()
	claude := claudetest.Path(t)
	b := &gwBundle{fake: anthropicfake.New(t, reply)}
	b.f = fleettest.New(t, fleettest.Opts{AckWait: 5 * time.Second})
	gw, err := gateway.Start(gateway.Config{Upstream: b.fake.URL, APIKey: gwKey, Logger: &b.f.Logger,
		Publisher:   gateway.JetStreamPublisher{JS: b.f.JS, Names: b.f.Names},
		OnRateLimit: worker.ForwardRateLimits(b.f.NC, b.f.Names, b.f.Logger)})
	require.NoError(t, err)
	b.gw = gw
	// Registered before the worker's: stopped after it, as the command does.
	t.Cleanup(func() { _ = gw.Stop(context.Background()) })
	w := b.f.StartWorker(fleettest.WorkerOpts{Slots: 1, SandboxEnv: map[string]string{"IS_SANDBOX": "1"},
		AgentMod: func(c *agent.Config) { c.Command = []string{claude} },
		Mod: func(c *worker.Config) {
			c.Gateway, c.TenantBudget = gw, worker.TenantBudgets(b.f.JS, b.f.Names, b.f.Logger)
		}})
	fleettest.WaitReady(t, w.W)
	return b
}

// modelEvents reads a query's stored .model events.
func modelEvents(t *testing.T, f *fleettest.Fleet, tenant, id string) []gateway.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := f.JS.OrderedConsumer(ctx, f.Names.QueriesStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{f.Names.QueryModel(tenant, id)}})
	require.NoError(t, err)
	var out []gateway.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return out
		}
		ev, err := gateway.DecodeEvent(m.Data())
		require.NoError(t, err)
		out = append(out, ev)
	}
}

// requireMetered checks the fake's side: every request carried the
// worker's key and no token, one .model event per Messages call, numbered
// 1..n, their sum the terminal total_cost_usd.
func (b *gwBundle) requireMetered(t *testing.T, id string, final *protocol.StatusEvent) []gateway.Event {
	t.Helper()
	calls := 0
	for _, r := range b.fake.Requests() {
		require.Equal(t, gwKey, r.Header.Get("X-Api-Key"), "the fake sees the worker's key on %s", r.Path)
		require.NotContains(t, strings.Join(r.Header.Values("Authorization"), " "), gateway.TokenPrefix)
		if r.Path == "/v1/messages" {
			calls++
		}
	}
	require.Positive(t, calls)
	evs := modelEvents(t, b.f, "default", id)
	require.Len(t, evs, calls, "one .model event per call")
	sum := 0.0
	for i, ev := range evs {
		require.Equal(t, i+1, ev.Call, "calls numbered from 1 across the query's runs")
		require.Equal(t, 200, ev.Status)
		sum += ev.CostUSD
	}
	require.Positive(t, sum)
	require.NotNil(t, final.Result)
	require.InDelta(t, sum, final.Result.TotalCostUSD, 1e-9, "total_cost_usd is the sum of the .model costs")
	return evs
}

// requireNoKey: the query's lines (the agent's output, its tools' output)
// hold no trace of the worker's key.
func requireNoKey(t *testing.T, r fleettest.Run) string {
	t.Helper()
	all := string(fleettest.JoinLines(fleettest.RequireContiguous(t, r)))
	require.NotContains(t, all, gwKey)
	require.NotContains(t, all, "Zq9K"+"v7Wm")
	return all
}

// A one-shot run through the gateway: the agent's Bash tool dumps its
// environment, Claude Code's own environ and argv, and greps the sandbox
// for the key: only the run's token and the gateway's URL are there.
func TestClaudeGatewayOneShot(t *testing.T) {
	t.Parallel()
	probe := `env; tr '\0' '\n' < /proc/$PPID/environ | grep -c ANTHROPIC_API_KEY=fleet-run-; ` +
		`tr '\0' ' ' < /proc/$PPID/cmdline; echo; grep -rhoa "$(printf 'Zq9K%s' v7Wm)" "$HOME" "$PWD" "$TMPDIR" 2>/dev/null; echo probe-done`
	b := setupGateway(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if strings.Contains(string(r.Messages[len(r.Messages)-1].Content), "tool_result") {
			res := r.ToolResults()
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("probe said: " + res[len(res)-1])},
				Usage: &anthropicfake.Usage{InputTokens: 3000, OutputTokens: 200}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": probe, "description": "probe"})},
			Usage: &anthropicfake.Usage{InputTokens: 2000, OutputTokens: 100}}
	})
	f := b.f
	body, err := json.Marshal(protocol.Job{ID: "gw-1", Prompt: "probe", Options: protocol.Options{AllowedTools: []string{"Bash"}}})
	require.NoError(t, err)
	f.PublishJob("default", body, nil)
	r := f.Follow("default", "gw-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	all := requireNoKey(t, r)
	res := results(r)
	require.Len(t, res, 1)
	said, _ := res[0]["result"].(string)
	require.Contains(t, said, "probe-done", "the probe ran")
	require.Contains(t, said, "ANTHROPIC_API_KEY=fleet-run-", "the agent holds its run's token")
	require.Contains(t, said, "ANTHROPIC_BASE_URL=http://127.0.0.1:", "and the gateway's URL")
	require.NotContains(t, said, "ANTHROPIC_AUTH_TOKEN")
	require.NotContains(t, said, "CLAUDE_CODE_OAUTH_TOKEN")
	require.Contains(t, all, "claude", "Claude Code's argv was dumped")
	evs := b.requireMetered(t, "gw-1", r.Final)
	require.GreaterOrEqual(t, len(evs), 2, "the tool call and the answer after it")
}

// A session through the gateway with a cap: the prompt's turn, then it
// parks; a resumed job gets a new token and numbers its calls on; a
// second turn; the third turn's call crosses max_cost_usd, and the session
// ends failed / budget, its total the sum of the .model costs.
func TestClaudeGatewaySessionCap(t *testing.T) {
	t.Parallel()
	b := setupGateway(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		u := &anthropicfake.Usage{InputTokens: 1000, OutputTokens: 50}
		if r.LastUserText() == "expensive" {
			u = &anthropicfake.Usage{InputTokens: 400_000, OutputTokens: 1000}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}, Usage: u}
	})
	f := b.f
	one := 1
	maxCost := 0.5
	sw := watchStatus(t, f, "default", "gw-s")
	body, err := json.Marshal(protocol.Job{ID: "gw-s", Prompt: "first", Session: &protocol.Session{IdleTimeoutS: &one}, MaxCostUSD: &maxCost})
	require.NoError(t, err)
	f.PublishJob("default", body, map[string]string{protocol.HeaderMsgID: "default.gw-s"})
	sw.state(protocol.StateParked, 1)
	parkedCalls := len(modelEvents(t, f, "default", "gw-s"))
	require.Positive(t, parkedCalls, "the parked session's calls are stored before its parked status")

	sendCtl(t, f, "default", "gw-s", input("second"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "gw-s", input("expensive"))
	r := f.Follow("default", "gw-s", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeBudget, r.Final.Error.Code, r.Final.Error.Message)
	require.Contains(t, r.Final.Error.Message, "max_cost_usd")
	requireNoKey(t, r)
	evs := b.requireMetered(t, "gw-s", r.Final)
	require.Greater(t, len(evs), parkedCalls, "the resumed job numbered its calls on")
	require.GreaterOrEqual(t, r.Final.Result.TotalCostUSD, maxCost, "the crossing call was forwarded and counted")
	require.Equal(t, []string{"first", "second", "expensive"}, userTurns(b.fake), "nothing after the crossing call")
	for _, ev := range sw.all() {
		if ev.State.Terminal() {
			require.Equal(t, protocol.StateFailed, ev.State)
		}
	}
}

// The tenant's budget is enforced live: its settings leave $0.40 in the
// window, the run's first call costs more, and the run ends failed /
// budget saying so, its total the metered spend.
func TestClaudeGatewayTenantBudget(t *testing.T) {
	t.Parallel()
	b := setupGateway(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo more", "description": "more"})},
			Usage: &anthropicfake.Usage{InputTokens: 200_000, OutputTokens: 100}}
	})
	f := b.f
	ctx := context.Background()
	tenants, err := admission.OpenTenants(ctx, f.JS, f.Names, true)
	require.NoError(t, err)
	require.NoError(t, tenants.Set(ctx, "budgeted", admission.Settings{BudgetUSD: 0.4, BudgetWindow: admission.Duration(time.Hour)}))
	body, err := json.Marshal(protocol.Job{ID: "gw-t", Prompt: "spend", Options: protocol.Options{AllowedTools: []string{"Bash"}}})
	require.NoError(t, err)
	f.PublishJob("budgeted", body, nil)
	r := f.Follow("budgeted", "gw-t", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeBudget, r.Final.Error.Code, r.Final.Error.Message)
	require.Contains(t, r.Final.Error.Message, "the tenant's model budget is used up")
	evs := modelEvents(t, f, "budgeted", "gw-t")
	require.NotEmpty(t, evs)
	sum := 0.0
	for _, ev := range evs {
		sum += ev.CostUSD
	}
	require.InDelta(t, sum, r.Final.Result.TotalCostUSD, 1e-9)
	require.Greater(t, sum, 0.4)
	require.Len(t, b.fake.Conversation(), 1, "the crossing call was the last one forwarded")
}

// An upstream 429 passes through to the agent (which retries) and goes to
// admission as a rate-limit line for the tenant.
func TestClaudeGatewayRateLimitReachesAdmission(t *testing.T) {
	t.Parallel()
	var limited atomic.Bool
	b := setupGateway(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if limited.CompareAndSwap(false, true) {
			return anthropicfake.Reply{Status: 429, Header: map[string]string{"retry-after-ms": "300"}}
		}
		return text("after the limit")
	})
	f := b.f
	lines := make(chan *nats.Msg, 16)
	sub, err := f.NC.ChanSubscribe(f.Names.RateLimitSubject("default"), lines)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, f.NC.Flush())
	f.SubmitJSON("default", "gw-rl", "hello")
	r := f.Follow("default", "gw-rl", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Equal(t, "after the limit", results(r)[0]["result"], "the agent retried after the 429")
	for {
		select {
		case m := <-lines:
			if !strings.Contains(string(m.Data), "model gateway") {
				continue // the agent's own rate_limit_event lines go there too
			}
			until, hit := admission.RateLimitUntil(m.Data, time.Now(), time.Minute)
			require.True(t, hit, "admission reads it as a rate limit: %s", m.Data)
			require.False(t, until.IsZero())
			evs := modelEvents(t, f, "default", "gw-rl")
			require.Equal(t, 429, evs[0].Status, "the 429 is a call, with its event")
			return
		case <-time.After(wait):
			t.Fatal("no rate-limit line from the gateway")
		}
	}
}

// A job may not set the model's variables: the job is invalid, saying why.
func TestGatewayJobMayNotSetModelEnv(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, EnvAllow: []string{"SOMETHING"}})
	fleettest.WaitReady(t, w.W)
	for _, name := range []string{"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN", "anthropic_auth_token"} {
		id := "env-" + strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		body, err := json.Marshal(protocol.Job{ID: id, Prompt: "hi", Options: protocol.Options{Env: map[string]string{name: "x"}}})
		require.NoError(t, err)
		f.PublishJob("default", body, nil)
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State)
		require.NotNil(t, r.Final.Error)
		require.Contains(t, r.Final.Error.Message, "options.env."+name)
		require.Contains(t, r.Final.Error.Message, "never sets a model credential")
	}
}
