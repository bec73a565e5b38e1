package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/securetest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The secure profile with the real Claude Code CLI behind the model
// gateway, on worker.creds: a tenant with a $1 budget whose agent's every
// call costs more. The worker reads the budget from the tenant table, so
// the call that crosses it is the last one forwarded; its .model events
// are stored (metering, SSE "model" events), and the run ends failed /
// budget saying so.
func TestSecureProfileMeteredBudget(t *testing.T) {
	t.Parallel()
	claude := claudetest.Path(t)
	fake := anthropicfake.New(t, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo more", "description": "more"})},
			Usage: &anthropicfake.Usage{InputTokens: 2_000_000, OutputTokens: 100}}
	})
	p := securetest.StartProfile(t, securetest.Options{Workers: 1, Warm: -1, AgentCmd: claude, ModelUpstream: fake.URL, ModelKey: gwKey})
	code, _, errs := p.RunNATS("tenant", "set", "acme", "--budget-usd", "1", "--budget-window", "24h", "--nats-creds", p.Creds(tenancy.AdminFile))
	require.Equal(t, 0, code, errs)
	acme := v1{t: t, base: p.HTTP, token: p.TenantToken("acme")}
	code, b := acme.do(http.MethodPost, "/v1/queries", `{"id":"m1","prompt":"spend","options":{"allowed_tools":["Bash"]}}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	final := acme.waitTerminal("m1")
	require.Equal(t, protocol.StateFailed, final.State)
	require.NotNil(t, final.Error)
	require.Equal(t, protocol.CodeBudget, final.Error.Code, final.Error.Message)
	require.Contains(t, final.Error.Message, "the tenant's model budget is used up")
	require.Len(t, fake.Conversation(), 1, "the call that crossed the budget was the last one forwarded")
	require.NotNil(t, final.Result)
	require.Greater(t, final.Result.TotalCostUSD, 1.0, "the metered spend is the status's total")

	var models int
	for _, e := range acme.events("m1") {
		if e.typ == "model" {
			models++
			require.True(t, strings.Contains(e.data, `"cost_usd"`), e.data)
		}
	}
	require.Equal(t, 1, models, "one SSE model event per forwarded call (stored by the worker's creds)")
}
