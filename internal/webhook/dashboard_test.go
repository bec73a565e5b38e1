package webhook_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/dashboard"
	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/webhook"
)

// TestDashboardShowsFailingDeliveries: the dashboard's fleet page lists a
// delivery that keeps failing, with its last error; a delivered one is not
// listed.
func TestDashboardShowsFailingDeliveries(t *testing.T) {
	fx := newFixture(t, 2, nil)
	bad := newReceiver(t, func(*http.Request, int) int { return http.StatusTeapot })
	good := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
	fx.add(t, "dash", bad, bad.srv.URL, "succeeded")
	fx.add(t, "fine", good, good.srv.URL, "succeeded")
	fx.f.SubmitJSON("dash", "dq1", "hi")
	fx.f.SubmitJSON("fine", "fq1", "hi")
	bad.waitFor("dq1 failing", func(h []hit) bool { return len(h) >= 1 })
	good.waitFor("fq1 delivered", func(h []hit) bool { return delivered(h, "query.succeeded", "fq1") })
	fleettest.Eventually(t, wait, func() bool {
		rep := fx.call(t, webhook.OpFailing, webhook.Request{})
		return len(rep.Deliveries) == 1
	}, "the failing delivery listed")

	q, err := fleetmetrics.New(fx.f.Client, 2)
	require.NoError(t, err)
	h, err := dashboard.New(dashboard.Config{Client: fx.f.Client, Queue: q, Logger: &fx.f.Logger})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	page := string(b)
	require.Contains(t, page, "Failing webhook deliveries")
	require.Contains(t, page, "dash/dq1")
	require.Contains(t, page, "HTTP 418")
	require.NotContains(t, page, "fine/fq1")
}
