package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// A warm Claude Code behind the model gateway: the warm agent's token was
// minted unbound at spawn and bound to the run at take, so the run's calls
// are metered as the run's; a one-shot job, then a session.
func TestWarmClaudeThroughTheGateway(t *testing.T) {
	t.Parallel()
	claude := claudetest.Path(t)
	b := &gwBundle{fake: anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("metered answer to " + r.LastUserText())},
			Usage: &anthropicfake.Usage{InputTokens: 1000, OutputTokens: 100}}
	})}
	b.f = fleettest.New(t, fleettest.Opts{AckWait: 5 * time.Second})
	gw, err := gateway.Start(gateway.Config{Upstream: b.fake.URL, APIKey: gwKey, Logger: &b.f.Logger,
		Publisher: gateway.JetStreamPublisher{JS: b.f.JS, Names: b.f.Names}})
	require.NoError(t, err)
	b.gw = gw
	t.Cleanup(func() { _ = gw.Stop(context.Background()) })
	events := make(chan (<-chan warm.Event), 1)
	w := b.f.StartWorker(fleettest.WorkerOpts{Slots: 1, SandboxEnv: map[string]string{"IS_SANDBOX": "1"},
		AgentMod: func(c *agent.Config) { c.Command = []string{claude} },
		Mod: func(c *worker.Config) {
			c.Gateway = gw
			c.Warm = 1
			c.Test.WarmEvents = func(ch <-chan warm.Event) { events <- ch }
		}})
	fleettest.WaitReady(t, w.W)
	wf := &warmFleet{f: b.f, w: w, events: <-events}
	wf.next(t, warm.EventReady)

	b.f.SubmitJSON("default", "warm-gw", "metered question")
	r := b.f.Follow("default", "warm-gw", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireWarm(t, r, true)
	requireNoKey(t, r)
	require.True(t, linesContain(r, "metered answer to metered question"))
	b.requireMetered(t, "warm-gw", r.Final)

	wf.next(t, warm.EventReady)
	sw := watchStatus(t, b.f, "default", "warm-gw-session")
	submitSession(t, b.f, "default", "warm-gw-session", "first metered turn", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, b.f, "default", "warm-gw-session", protocol.CtlOp{Op: protocol.OpEnd})
	r = b.f.Follow("default", "warm-gw-session", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireWarm(t, r, true)
	require.True(t, linesContain(r, "metered answer to first metered turn"))
	require.Len(t, modelEvents(t, b.f, "default", "warm-gw-session"), 1, "the session's call is metered as its own")
}
