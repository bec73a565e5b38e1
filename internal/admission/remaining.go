package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Remaining returns what is left of a tenant's budget in its window holding
// now: its BudgetUSD (FLEET_TENANTS) less the spend recorded for that
// window (spend.<tenant>.<window> in the admission bucket, the
// total_cost_usd of its terminal results). limited is false when the
// tenant has no budget (no settings, or none set, or the buckets do not
// exist yet). The worker's model gateway reads it when a run opens, to
// enforce the budget live (docs/gateway.md); the spend of runs still going is not
// in it (the gateway adds its own).
func Remaining(ctx context.Context, js jetstream.JetStream, names protocol.Names, tenant string, now time.Time) (remainingUSD float64, limited bool, err error) {
	tkv, err := js.KeyValue(ctx, names.TenantsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("admission: bucket %s: %w", names.TenantsBucket(), err)
	}
	s, err := (&Tenants{kv: tkv}).Get(ctx, tenant)
	switch {
	case errors.Is(err, ErrNoTenant):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case !(s.BudgetUSD > 0):
		return 0, false, nil
	}
	skv, err := js.KeyValue(ctx, names.AdmissionBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return s.BudgetUSD, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("admission: bucket %s: %w", names.AdmissionBucket(), err)
	}
	spent := 0.0
	e, err := skv.Get(ctx, spendKey(tenant, WindowStart(now, time.Duration(s.BudgetWindow))))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return 0, false, fmt.Errorf("admission: spend of %s: %w", tenant, err)
	default:
		if v, perr := strconv.ParseFloat(string(e.Value()), 64); perr == nil && !math.IsNaN(v) {
			spent = v
		}
	}
	return max(0, s.BudgetUSD-spent), true, nil
}
