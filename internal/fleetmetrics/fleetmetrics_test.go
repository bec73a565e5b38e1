package fleetmetrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
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
# HELP fleet_desired_workers ` + desiredHelp + `
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

// Jobs admission holds back (here by their tenant's cap) are not work a new
// worker could start: fleet_desired_workers leaves them out, and
// fleet_held_jobs counts them by reason.
func TestHeldJobsAreNotDesiredWorkers(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tenants, err := admission.OpenTenants(ctx, f.JS, f.Names, true)
	require.NoError(t, err)
	require.NoError(t, tenants.Set(ctx, "acme", admission.Settings{MaxRunning: 1}))
	submit := func(tenant, id string) {
		r, err := f.Client.Submit(ctx, protocol.Job{ID: id, Tenant: tenant, Prompt: "x"})
		require.NoError(t, err)
		require.Nil(t, r.Error)
	}
	// No worker: acme's first job is admitted and waits for one, its next
	// three are held by acme's cap; beta's job is admitted.
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		submit("acme", id)
	}
	submit("beta", "b1")
	c, err := New(f.Client, 1)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	want := `
# HELP fleet_desired_workers ` + desiredHelp + `
# TYPE fleet_desired_workers gauge
fleet_desired_workers 2
# HELP fleet_held_jobs Jobs admission holds back, by the reason it gives (budget, rate_limited, tenant_cap, fleet_cap).
# TYPE fleet_held_jobs gauge
fleet_held_jobs{reason="budget"} 0
fleet_held_jobs{reason="fleet_cap"} 0
fleet_held_jobs{reason="rate_limited"} 0
fleet_held_jobs{reason="tenant_cap"} 3
`
	var diff error
	fleettest.Eventually(t, time.Minute, func() bool {
		diff = testutil.GatherAndCompare(reg, strings.NewReader(want), "fleet_desired_workers", "fleet_held_jobs")
		return diff == nil
	}, "held jobs out of the desired workers")
	require.NoError(t, diff)
}
