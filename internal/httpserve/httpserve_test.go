package httpserve_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/httpserve"
	"github.com/agentfleet/agentfleet/internal/worker"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	reg := prometheus.NewRegistry()
	worker.NewMetrics(reg, 4, func() (int64, int64) { return 12, 3456 })
	s, err := httpserve.Start("127.0.0.1:0"+"", ready.Load, reg, zerolog.Nop())
	require.NoError(t, err)
	require.Nil(t, s, "127.0.0.1:0 means off")

	s, err = httpserve.Start("127.0.0.1:", ready.Load, reg, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	base := "http://" + s.Addr()

	code, _ := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready until the component says so")
	ready.Store(true)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code)

	code, body := get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, m := range []string{
		"fleet_worker_free_slots 4", "fleet_worker_running_slots 0",
		"fleet_worker_journal_backlog_lines 12", "fleet_worker_journal_backlog_bytes 3456",
		"fleet_worker_lines_relayed_total 0", "fleet_worker_publish_errors_total 0",
		"fleet_worker_journal_full 0", "fleet_worker_lines_not_journaled_total 0",
	} {
		require.Contains(t, body, m)
	}
}

// TestReadyzSaysWhy: a component that is not ready says why in /readyz.
func TestReadyzSaysWhy(t *testing.T) {
	t.Parallel()
	var why atomic.Pointer[error]
	notReady := func() error {
		if p := why.Load(); p != nil {
			return *p
		}
		return nil
	}
	s, err := httpserve.StartWithReason("127.0.0.1:", notReady, prometheus.NewRegistry(), zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	full := errors.New("not pulling jobs: journal disk full (/var/lib/fleet): no space left on device")
	why.Store(&full)
	code, body := get(t, "http://"+s.Addr()+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "journal disk full")
	why.Store(nil)
	code, _ = get(t, "http://"+s.Addr()+"/readyz")
	require.Equal(t, http.StatusOK, code)
}
