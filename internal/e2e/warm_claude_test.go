package e2e

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// warmClaude starts a worker running the CLI with one warm agent, and
// waits for it.
func warmClaude(t *testing.T, b *claudeBundle) *warmFleet {
	t.Helper()
	events := make(chan (<-chan warm.Event), 1)
	w := b.f.StartWorker(fleettest.WorkerOpts{Slots: 1, SandboxEnv: b.env,
		AgentMod: func(c *agent.Config) { c.Command = []string{b.claude} },
		Mod: func(c *worker.Config) {
			c.Warm = 1
			c.Test.WarmEvents = func(ch <-chan warm.Event) { events <- ch }
		}})
	fleettest.WaitReady(t, w.W)
	wf := &warmFleet{f: b.f, w: w, events: <-events}
	wf.next(t, warm.EventReady)
	return wf
}

// A one-shot job on a warm Claude Code (the pinned CLI against the fake
// API): running says warm:true, the CLI's first model call carries the
// job's prompt, and the run ends with the CLI's own result. Then a
// session on the replacement: two turns on the warm CLI.
func TestWarmClaudeOneShotAndSession(t *testing.T) {
	t.Parallel()
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply { return text("warm answer to " + r.LastUserText()) })
	wf := warmClaude(t, b)

	b.f.SubmitJSON("default", "warm-claude", "what is a warm start?")
	r := b.f.Follow("default", "warm-claude", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireWarm(t, r, true)
	require.False(t, r.Final.Result.Synthetic, "the CLI's own result")
	require.True(t, linesContain(r, "warm answer to what is a warm start?"), "the CLI answered the job's prompt")
	require.Contains(t, userTurns(b.fake), "what is a warm start?")

	wf.next(t, warm.EventReady)
	sw := watchStatus(t, b.f, "default", "warm-claude-session")
	submitSession(t, b.f, "default", "warm-claude-session", "first warm turn", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, b.f, "default", "warm-claude-session", input("second warm turn"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, b.f, "default", "warm-claude-session", protocol.CtlOp{Op: protocol.OpEnd})
	r = b.f.Follow("default", "warm-claude-session", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Equal(t, 2, r.Final.Turn)
	requireWarm(t, r, true)
	require.True(t, linesContain(r, "warm answer to first warm turn") && linesContain(r, "warm answer to second warm turn"))
}
