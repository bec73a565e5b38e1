package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A metered run whose tenant's budget cannot be read is refused, saying
// why on its status (failed / budget), and its agent never starts: the
// budget fails closed, never unlimited. The worker reads the budget on a
// connection that may not (here: closed, as a refused permission or a
// lost server leaves it).
func TestTenantBudgetUnreadableRefusesRun(t *testing.T) {
	t.Parallel()
	fake := anthropicfake.New(t, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("hi")}}
	})
	f := fleettest.New(t, fleettest.Opts{AckWait: 5 * time.Second})
	gw, err := gateway.Start(gateway.Config{Upstream: fake.URL, APIKey: gwKey, Logger: &f.Logger,
		Publisher: gateway.JetStreamPublisher{JS: f.JS, Names: f.Names}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = gw.Stop(context.Background()) })
	deadNC, deadJS := natstest.Connect(t, f.Srv)
	deadNC.Close()
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Gateway, c.TenantBudget = gw, worker.TenantBudgets(deadJS, f.Names, f.Logger)
	}})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "unread-1", "should-not-run")
	r := f.Follow("default", "unread-1", time.Minute)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeBudget, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "budget could not be read")
	for _, l := range r.Lines {
		require.False(t, strings.Contains(string(l.Data), "should-not-run"), "the agent ran: %s", l.Data)
	}
}
