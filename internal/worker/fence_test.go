package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// wait bounds every wait for an event (generous: `make test` runs all
// packages at once on 2 cores).
const wait = 2 * time.Minute

// TestFencedRunReleasesEverything: when a later attempt announces itself,
// the run stops, and its goroutines (relay, heartbeat) end with it; the
// package's goleak check fails if the relay is left waiting.
func TestFencedRunReleasesEverything(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	started, ended := make(chan int, 4), make(chan int, 4)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, _ string, attempt int) { started <- attempt }
		c.Test.RunEnded = func(_, _ string, attempt int) { ended <- attempt }
	}})
	f.SubmitJSON("default", "fence1", "/standin lines=100000 delay=5ms")
	require.Equal(t, 1, recv(t, started))

	// Attempt 2 announces itself, as a redelivery elsewhere would.
	ev, err := json.Marshal(protocol.StatusEvent{
		V: protocol.SchemaVersion, ID: "fence1", Tenant: "default", State: protocol.StateRetrying, Attempt: 2, Worker: "other",
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = f.JS.Publish(ctx, f.Names.QueryStatus("default", "fence1"), ev)
	require.NoError(t, err)
	require.Equal(t, 1, recv(t, ended), "the fenced run's agent is stopped")

	// The fenced run leaves the message alone; Stop returns once every
	// run (and what it started) is over.
	require.NoError(t, w.W.Stop(ctx))
}

func recv[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(wait):
		t.Fatal("timed out")
		panic("unreachable")
	}
}
