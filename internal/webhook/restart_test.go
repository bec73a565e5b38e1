package webhook_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/webhook"
)

// TestRestartLosesNoDelivery: a delivery failing when the service stops,
// and a status event that happens while no service runs, are both
// delivered by the next service, the first with its webhook-id unchanged.
func TestRestartLosesNoDelivery(t *testing.T) {
	fx := newFixture(t, 2, nil)
	var up atomic.Bool
	rc := newReceiver(t, func(*http.Request, int) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusBadGateway
	})
	ep := fx.add(t, "rs", rc, rc.srv.URL, "succeeded")
	fx.f.SubmitJSON("rs", "r1", "hi")
	rc.waitFor("r1 failing", func(h []hit) bool { return len(h) >= 1 })
	first := fx.deliveries(t, "rs", ep.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, fx.svc.Stop(ctx))

	// r2 ends while no service runs.
	fx.f.SubmitJSON("rs", "r2", "hi")
	fx.f.Follow("rs", "r2", wait)
	up.Store(true)

	svc, err := webhook.New(webhook.Config{NC: fx.f.NC, Names: fx.f.Names, Backoff: 20 * time.Millisecond, AllowPrivate: true,
		Timeout: 500 * time.Millisecond, Sweep: 100 * time.Millisecond, Logger: &fx.f.Logger})
	require.NoError(t, err)
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(func() { _ = svc.Stop(context.Background()) })
	hits := rc.waitFor("r1 and r2 delivered", func(h []hit) bool {
		return delivered(h, "query.succeeded", "r1") && delivered(h, "query.succeeded", "r2")
	})
	require.Len(t, first, 1)
	for _, h := range hits {
		if h.Query == "r1" {
			require.Equal(t, first[0].WebhookID, h.ID, "the same webhook-id after the restart")
		}
	}
}

// TestTwoDispatchersDeliverOnce: with two services (two dispatchers)
// sharing the consumer and the buckets, and both sweeping, each delivery
// is made once: an attempt is claimed in the record before it is made.
func TestTwoDispatchersDeliverOnce(t *testing.T) {
	fx := newFixture(t, 4, nil)
	other, err := webhook.New(webhook.Config{NC: fx.f.NC, Names: fx.f.Names, Backoff: 20 * time.Millisecond, AllowPrivate: true,
		Timeout: 5 * time.Second, Sweep: 10 * time.Millisecond, Logger: &fx.f.Logger})
	require.NoError(t, err)
	require.NoError(t, other.Start(context.Background()))
	t.Cleanup(func() { _ = other.Stop(context.Background()) })
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
	fx.add(t, "two", rc, rc.srv.URL, "succeeded")
	const n = 30
	fx.run(t, "two", n)
	hits := rc.waitFor("every delivery", func(h []hit) bool {
		got := map[string]bool{}
		for _, x := range h {
			got[x.Query] = true
		}
		return len(got) == n
	})
	// Every delivery recorded done, then no more requests than deliveries.
	fleettest.Eventually(t, wait, func() bool {
		done := 0
		for _, d := range fx.deliveries(t, "two", "") {
			if d.Done {
				done++
			}
		}
		return done == n
	}, "every delivery recorded done")
	rc.mu.Lock()
	hits = append(hits[:0:0], rc.hits...)
	rc.mu.Unlock()
	require.Len(t, hits, n, "each delivery made once")
}
