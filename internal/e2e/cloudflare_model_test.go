package e2e

// Model metering of Cloudflare sandboxes (docs/gateway.md), with the real Claude
// Code CLI in the Go fake of the bridge: the fake holds the key and meters
// at its egress (pkg/gateway behind the bridge's /model routes), the
// worker opens the run on the bridge, publishes the calls it reads as
// .model events, reports their sum, and ends a capped run failed / budget.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

func TestClaudeCloudflareMetered(t *testing.T) {
	t.Parallel()
	claude := claudetest.Path(t)
	api := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if strings.Contains(r.LastUserText(), "spend") {
			// The tool runs until the run is stopped: only the worker,
			// reading the cap off the bridge mid-run, ends it (Claude
			// Code refuses a standalone sleep, so tail it is).
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "tail -f /dev/null", "description": "wait", "timeout": 600000})},
				Usage: &anthropicfake.Usage{InputTokens: 200_000, OutputTokens: 100}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("hello from the bridge")},
			Usage: &anthropicfake.Usage{InputTokens: 1000, OutputTokens: 50}}
	})
	fake := bridgefake.New(t, bridgefake.Options{ModelUpstream: api.URL, ModelAPIKey: gwKey, BaseEnv: map[string]string{"IS_SANDBOX": "1"}})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1,
		AgentMod: func(c *agent.Config) { c.Command = []string{claude} },
		Mod: func(c *worker.Config) {
			c.Providers[protocol.SandboxCloudflare] = cf
			c.DefaultSandbox = protocol.SandboxCloudflare
			c.TenantBudget = worker.TenantBudgets(f.JS, f.Names, f.Logger)
		},
	})
	fleettest.WaitReady(t, w.W)

	// A run within its cap: every call metered into .model, their sum the total.
	f.SubmitJSON("default", "cfm-1", "say hello")
	r := f.Follow("default", "cfm-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireNoKey(t, r)
	calls := 0
	for _, q := range api.Requests() {
		require.Equal(t, gwKey, q.Header.Get("X-Api-Key"), "the upstream sees the bridge's key on %s", q.Path)
		if q.Path == "/v1/messages" {
			calls++
		}
	}
	require.Positive(t, calls)
	evs := modelEvents(t, f, "default", "cfm-1")
	require.Len(t, evs, calls, "one .model event per call")
	sum := 0.0
	for i, ev := range evs {
		require.Equal(t, i+1, ev.Call)
		require.Equal(t, 1, ev.Attempt)
		require.Equal(t, 200, ev.Status)
		sum += ev.CostUSD
	}
	require.Positive(t, sum)
	require.InDelta(t, sum, r.Final.Result.TotalCostUSD, 1e-9, "total_cost_usd is the sum of the .model costs")

	// A run whose first call crosses max_cost_usd, then runs a tool that
	// would not end: the worker reads the cap off the bridge and stops the
	// run, failed / budget; the bridge forwarded nothing more.
	before := len(api.Conversation())
	maxCost := 0.05
	body, err := json.Marshal(protocol.Job{ID: "cfm-2", Prompt: "spend", MaxCostUSD: &maxCost, Options: protocol.Options{AllowedTools: []string{"Bash"}}})
	require.NoError(t, err)
	f.PublishJob("default", body, nil)
	r = f.Follow("default", "cfm-2", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeBudget, r.Final.Error.Code, r.Final.Error.Message)
	require.Contains(t, r.Final.Error.Message, "max_cost_usd")
	requireNoKey(t, r)
	require.Len(t, api.Conversation(), before+1, "the crossing call was the last one forwarded")
	evs = modelEvents(t, f, "default", "cfm-2")
	require.NotEmpty(t, evs)
	sum = 0
	for _, ev := range evs {
		sum += ev.CostUSD
	}
	require.Greater(t, sum, maxCost)
	require.InDelta(t, sum, r.Final.Result.TotalCostUSD, 1e-9)

	// The tenant's budget caps a Cloudflare run too: $0.40 left, the first
	// call costs more.
	ctx := context.Background()
	tenants, err := admission.OpenTenants(ctx, f.JS, f.Names, true)
	require.NoError(t, err)
	require.NoError(t, tenants.Set(ctx, "budgeted", admission.Settings{BudgetUSD: 0.4, BudgetWindow: admission.Duration(time.Hour)}))
	before = len(api.Conversation())
	body, err = json.Marshal(protocol.Job{ID: "cfm-3", Prompt: "spend", Options: protocol.Options{AllowedTools: []string{"Bash"}}})
	require.NoError(t, err)
	f.PublishJob("budgeted", body, nil)
	r = f.Follow("budgeted", "cfm-3", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeBudget, r.Final.Error.Code, r.Final.Error.Message)
	require.Contains(t, r.Final.Error.Message, "the tenant's model budget is used up")
	require.Len(t, api.Conversation(), before+1, "the crossing call was the last one forwarded")
	evs = modelEvents(t, f, "budgeted", "cfm-3")
	require.NotEmpty(t, evs)
	sum = 0
	for _, ev := range evs {
		sum += ev.CostUSD
	}
	require.Greater(t, sum, 0.4)
	require.InDelta(t, sum, r.Final.Result.TotalCostUSD, 1e-9)
}
