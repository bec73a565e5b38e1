package worker_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/envcache"
)

// The worker owns its environment cache's background work (preparing
// copies to restore): it starts it with itself and stops it with itself
// (goleak, in TestMain, checks nothing of it is left).
func TestWorkerStartsAndStopsItsEnvCache(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	envs, err := envcache.Open(envcache.Config{Dir: filepath.Join(t.TempDir(), "envs")})
	require.NoError(t, err)
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) { c.EnvCache = envs }})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	<-a.W.Started()
	select {
	case <-envs.Started():
	default:
		t.Fatal("the worker started without starting its environment cache")
	}
	require.NoError(t, a.W.Stop(ctx))
	select {
	case <-envs.Stopped():
	default:
		t.Fatal("the worker stopped without stopping its environment cache")
	}
}
