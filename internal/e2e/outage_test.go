package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A NATS outage longer than AckWait, with jobs running and lines piling up
// in the workers' journals: when the server comes back on the same store,
// every job is redelivered while its first attempt still holds a backlog to
// relay and a terminal status to publish. Whoever gets there first, each
// query ends with exactly one terminal status, unique and contiguous
// Fleet-Seq, and a transcript equal to the stream (issue 8, point 2).
func TestNATSOutageLongerThanAckWait(t *testing.T) {
	t.Parallel()
	const ackWait = 2 * time.Second
	f := fleettest.New(t, fleettest.Opts{AckWait: ackWait})
	ended := make(chan string, 64)
	hooks := func(c *worker.Config) {
		c.Test.RunEnded = func(_, id string, attempt int) {
			if attempt == 1 {
				ended <- id
			}
		}
	}
	workers := []*fleettest.Worker{
		f.StartWorker(fleettest.WorkerOpts{Slots: 3, Mod: hooks}),
		f.StartWorker(fleettest.WorkerOpts{Slots: 3, Mod: hooks}),
	}
	for _, w := range workers {
		fleettest.WaitReady(t, w.W)
	}
	ids := []string{"out-1", "out-2", "out-3", "out-4", "out-5", "out-6"}
	for _, id := range ids {
		f.SubmitJSON("default", id, "/standin lines=150 delay=10ms")
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, id := range ids {
		waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", id), 5)
	}

	// The outage: the server goes away while every agent is still writing.
	f.Srv.Shutdown()
	// Every first attempt's agent exits during the outage, so each run
	// holds a journaled backlog and a terminal status it cannot send.
	for range ids {
		select {
		case <-ended:
		case <-ctx.Done():
			t.Fatal("agents did not finish during the outage")
		}
	}
	// The fault being injected is an outage longer than AckWait: every
	// unacked job is redelivered once the server is back.
	outage := time.NewTimer(3 * ackWait)
	<-outage.C
	f.Srv = natstest.Restart(t, f.Srv)

	for _, id := range ids {
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State, id)
	}
	// Let every attempt (the fenced ones included) end before reading the
	// histories, so a late second terminal status would be seen.
	for _, w := range workers {
		require.NoError(t, w.W.Stop(ctx))
	}
	redelivered := 0
	for _, id := range ids {
		h := f.History("default", id)
		fleettest.RequireOneTerminal(t, h)
		lines := fleettest.RequireContiguous(t, h)
		for _, ev := range h.Statuses {
			if ev.Attempt > 1 {
				redelivered++
				break
			}
		}
		for _, w := range workers {
			require.NoError(t, w.Journal.WaitPersisted(ctx, "default", id))
		}
		require.Equal(t, string(fleettest.JoinLines(lines)), string(f.Transcript(f.Objects, "default", id)),
			"%s: the stored transcript equals the stream", id)
	}
	require.NotZero(t, redelivered, "the outage outlasted AckWait: jobs were redelivered")
}
