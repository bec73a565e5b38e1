package worker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/startstop"
)

// TestWorkerLifecycle: the worker answers as every service of the fleet
// does (package startstop): a second Start fails as already started, a
// second Stop returns the first one's result, Start after Stop fails as
// stopped; a worker stopped before it started runs nothing and does not
// start afterwards.
func TestWorkerLifecycle(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	var cfg worker.Config
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) { cfg = *c }})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	<-a.W.Started()
	require.ErrorIs(t, a.W.Start(ctx), startstop.ErrAlreadyStarted)
	require.NoError(t, a.W.Stop(ctx))
	<-a.W.Stopped()
	require.NoError(t, a.W.Stop(ctx), "a second Stop returns the first one's result")
	require.ErrorIs(t, a.W.Start(ctx), startstop.ErrStopped)
	require.EqualError(t, a.W.NotReady(), "shutting down")

	never, err := worker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, never.Stop(ctx))
	<-never.Stopped()
	require.ErrorIs(t, never.Start(ctx), startstop.ErrStopped)
	select {
	case <-never.Started():
		t.Fatal("a worker stopped before it started reports it started")
	default:
	}
}
