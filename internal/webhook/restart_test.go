package webhook_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
