package fleetmetrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/discovery"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

// Jobs nobody takes show as depth and wait per tenant; a running job counts
// toward the desired workers but not the depth.
func TestQueueMetrics(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One worker with one slot runs one long job; the rest wait.
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	svc, err := discovery.ServeWorker(w.NC, f.Names, discovery.Worker{ID: w.W.ID(), Info: w.W.Info, Drain: func() {}})
	require.NoError(t, err)
	defer func() { _ = svc.Stop() }()
	submit := func(tenant, id, prompt string) {
		r, err := f.Client.Submit(ctx, protocol.Job{ID: id, Tenant: tenant, Prompt: prompt})
		require.NoError(t, err)
		require.Nil(t, r.Error)
	}
	submit("acme", "long", "/standin sleep=1h")
	fleettest.Eventually(t, time.Minute, func() bool { return w.W.Running() == 1 }, "the long job runs")
	submit("acme", "a2", "x")
	submit("acme", "a3", "x")
	submit("beta", "b1", "x")

	c, err := New(f.Client, 2)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP fleet_desired_workers Workers needed to run every waiting and running job at once (ceil(jobs / slots per worker)).
# TYPE fleet_desired_workers gauge
fleet_desired_workers 2
# HELP fleet_queue_depth Jobs no worker has taken yet, by tenant.
# TYPE fleet_queue_depth gauge
fleet_queue_depth{tenant="acme"} 2
fleet_queue_depth{tenant="beta"} 1
# HELP fleet_metrics_up 1 when the last scrape could read the queue from NATS.
# TYPE fleet_metrics_up gauge
fleet_metrics_up 1
`
	// The admitter copies a job to the work subject before it deletes the
	// original, so a scrape in between counts it twice: wait for the
	// queue to settle.
	var diff error
	fleettest.Eventually(t, time.Minute, func() bool {
		diff = testutil.GatherAndCompare(reg, strings.NewReader(want), "fleet_desired_workers", "fleet_queue_depth", "fleet_metrics_up")
		return diff == nil
	}, "the queue metrics")
	s, err := c.Snapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, s.Tenants["acme"].Running)
	require.Positive(t, s.Tenants["acme"].OldestWait)
	require.Positive(t, s.Tenants["beta"].OldestWait)
	require.Len(t, s.Workers, 1)
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("acme", "long"), []byte(`{"op":"cancel"}`)))
}
