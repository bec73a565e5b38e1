package admission

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Remaining is the tenant's budget less its window's recorded spend, not
// limited without buckets, settings or a budget, and spend of another
// window does not count.
func TestRemaining(t *testing.T) {
	_, _, js := natstest.RunJetStream(t)
	ctx := context.Background()
	names := protocol.NewNames("")
	now := time.Date(2026, 11, 27, 10, 30, 0, 0, time.UTC)
	rem := func(tenant string) (float64, bool) {
		t.Helper()
		v, limited, err := Remaining(ctx, js, names, tenant, now)
		require.NoError(t, err)
		return v, limited
	}
	_, limited := rem("acme")
	require.False(t, limited, "no buckets yet")

	tenants, err := OpenTenants(ctx, js, names, true)
	require.NoError(t, err)
	require.NoError(t, tenants.Set(ctx, "acme", Settings{BudgetUSD: 10, BudgetWindow: Duration(time.Hour)}))
	require.NoError(t, tenants.Set(ctx, "free", Settings{MaxRunning: 2}))
	v, limited := rem("acme")
	require.True(t, limited)
	require.InDelta(t, 10, v, 1e-9, "no admission bucket: nothing spent")
	_, limited = rem("free")
	require.False(t, limited, "settings without a budget")
	_, limited = rem("nobody")
	require.False(t, limited, "no settings")

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: names.AdmissionBucket()})
	require.NoError(t, err)
	require.NoError(t, addSpend(ctx, kv, "acme", WindowStart(now, time.Hour), 3.5))
	require.NoError(t, addSpend(ctx, kv, "acme", WindowStart(now, time.Hour), 1))
	require.NoError(t, addSpend(ctx, kv, "acme", WindowStart(now.Add(-time.Hour), time.Hour), 100))
	v, limited = rem("acme")
	require.True(t, limited)
	require.InDelta(t, 5.5, v, 1e-9)
	require.NoError(t, addSpend(ctx, kv, "acme", WindowStart(now, time.Hour), 20))
	v, _ = rem("acme")
	require.Zero(t, v, "over budget: nothing left")
}
