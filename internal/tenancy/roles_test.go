package tenancy_test

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The worker's creds read what its model gateway needs on a tenanted
// fleet: a tenant's budget_usd in the tenant table and the window's spend
// (read only), and they store and read back a run's .model events.
// Without these grants a tenant's budget was not enforced inside a run and
// no metering record was stored.
func TestWorkerRoleReadsBudgetsAndMeters(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	names := protocol.NewNames("")
	admin := s.role(tenancy.AdminFile, "client")
	ctx := ctxT(t, time.Minute)
	tenants, err := admission.OpenTenants(ctx, jsOf(t, admin), names, true)
	require.NoError(t, err)
	require.NoError(t, tenants.Set(ctx, "acme", admission.Settings{BudgetUSD: 1, BudgetWindow: admission.Duration(24 * time.Hour)}))
	_ = f

	errs := make(chan error, 16)
	wnc := s.connect(filepath.Join(s.Dir.Path, tenancy.WorkerFile), errs, nats.CustomInboxPrefix("_INBOX_worker"))
	wjs := jsOf(t, wnc)

	// The budget: read, not refused.
	rem, limited, err := admission.Remaining(ctx, wjs, names, "acme", time.Now())
	require.NoError(t, err, "the worker reads the tenant table")
	require.True(t, limited)
	require.InDelta(t, 1.0, rem, 1e-9)

	// A .model event is stored (the gateway's publisher), and read back
	// by an ordered consumer filtered on it (a retry's history).
	ev := gateway.Event{Call: 1, CostUSD: 2.4}
	b, _ := json.Marshal(ev)
	_, err = wjs.PublishMsg(ctx, &nats.Msg{Subject: names.QueryModel("acme", "q1"), Data: b})
	require.NoError(t, err, "the worker publishes .model")
	last, err := gateway.LastCall(ctx, wjs, names, "acme", "q1")
	require.NoError(t, err)
	require.Equal(t, 1, last.Call)
	cons, err := jsconsumer.Ordered(ctx, wjs, names.QueriesStream(), names.QueryModel("acme", "q1"))
	require.NoError(t, err, "the worker replays a query's .model events")
	jsconsumer.Release(wjs, names.QueriesStream(), cons)

	// Read only: the worker may not change the tenant table.
	kv, err := wjs.KeyValue(ctx, names.TenantsBucket())
	require.NoError(t, err)
	wctx := ctxT(t, 3*time.Second)
	_, err = kv.Put(wctx, "acme", []byte(`{"budget_usd":1000}`))
	require.Error(t, err, "a worker wrote the tenant table")
	err = kv.Delete(ctxT(t, 3*time.Second), "acme")
	require.Error(t, err, "a worker deleted from the tenant table")
	got, err := tenants.Get(ctx, "acme")
	require.NoError(t, err)
	require.InDelta(t, 1.0, got.BudgetUSD, 1e-9)
	// Nor read another bucket (the status store, say).
	_, err = wjs.KeyValue(ctxT(t, 3*time.Second), names.StatusBucket())
	require.Error(t, err)
	require.NotErrorIs(t, err, jetstream.ErrBucketNotFound)
}
