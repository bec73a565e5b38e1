package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ErrNoTenant is returned by Tenants.Get for a tenant without settings.
var ErrNoTenant = errors.New("admission: no settings for this tenant")

// Tenants reads and writes tenant settings in the KV bucket FLEET_TENANTS.
type Tenants struct {
	kv jetstream.KeyValue
}

// OpenTenants opens the tenants bucket; create makes it when missing (the
// dispatcher does; the CLI only opens it).
func OpenTenants(ctx context.Context, js jetstream.JetStream, names protocol.Names, create bool) (*Tenants, error) {
	var (
		kv  jetstream.KeyValue
		err error
	)
	if create {
		kv, err = provision.KeyValue(ctx, js, tenantsBucket(names, 1))
	} else {
		kv, err = js.KeyValue(ctx, names.TenantsBucket())
	}
	if err != nil {
		return nil, fmt.Errorf("admission: bucket %s: %w", names.TenantsBucket(), err)
	}
	return &Tenants{kv: kv}, nil
}

func tenantsBucket(names protocol.Names, replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: names.TenantsBucket(), Description: "agentfleet tenant admission settings", History: 5, Replicas: replicas,
	}
}

// Get returns a tenant's settings, or ErrNoTenant.
func (t *Tenants) Get(ctx context.Context, tenant string) (Settings, error) {
	if !protocol.ValidTenant(tenant) {
		return Settings{}, fmt.Errorf("admission: tenant must match %s", protocol.TenantPattern)
	}
	e, err := t.kv.Get(ctx, tenant)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Settings{}, ErrNoTenant
	}
	if err != nil {
		return Settings{}, err
	}
	return decodeSettings(e.Value())
}

func decodeSettings(b []byte) (Settings, error) {
	var s Settings
	if err := json.Unmarshal(b, &s); err != nil {
		return Settings{}, fmt.Errorf("admission: settings: %w", err)
	}
	return s, s.Validate()
}

// Set stores a tenant's settings after validating them.
func (t *Tenants) Set(ctx context.Context, tenant string, s Settings) error {
	if !protocol.ValidTenant(tenant) {
		return fmt.Errorf("admission: tenant must match %s", protocol.TenantPattern)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	_, err = t.kv.Put(ctx, tenant, b)
	return err
}

// Delete removes a tenant's settings (the defaults apply again).
func (t *Tenants) Delete(ctx context.Context, tenant string) error {
	if !protocol.ValidTenant(tenant) {
		return fmt.Errorf("admission: tenant must match %s", protocol.TenantPattern)
	}
	return t.kv.Delete(ctx, tenant)
}

// List returns every tenant with settings, by name.
func (t *Tenants) List(ctx context.Context) (map[string]Settings, []string, error) {
	keys, err := t.kv.ListKeys(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := map[string]Settings{}
	var names []string
	for k := range keys.Keys() {
		s, err := t.Get(ctx, k)
		if errors.Is(err, ErrNoTenant) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("tenant %s: %w", k, err)
		}
		out[k] = s
		names = append(names, k)
	}
	slices.Sort(names)
	return out, names, nil
}

// Keys of the admission bucket (FLEET_ADMISSION):
//
//	spend.<tenant>.<window start, unix seconds>   total_cost_usd of results in that window
//	pause.<tenant>                                 end of a rate-limit pause (RFC 3339)
func spendKey(tenant string, window time.Time) string {
	return "spend." + tenant + "." + strconv.FormatInt(window.Unix(), 10)
}

func pauseKey(tenant string) string { return "pause." + tenant }

// parseStateKey splits an admission-bucket key.
func parseStateKey(key string) (kind, tenant string, window int64, ok bool) {
	parts := strings.Split(key, ".")
	switch {
	case len(parts) == 3 && parts[0] == "spend":
		w, err := strconv.ParseInt(parts[2], 10, 64)
		return "spend", parts[1], w, err == nil
	case len(parts) == 2 && parts[0] == "pause":
		return "pause", parts[1], 0, true
	}
	return "", "", 0, false
}

// addSpend adds usd to a tenant's spend in a window, with compare-and-set
// so concurrent dispatchers never lose an addition.
func addSpend(ctx context.Context, kv jetstream.KeyValue, tenant string, window time.Time, usd float64) error {
	key := spendKey(tenant, window)
	for range 20 {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = kv.Create(ctx, key, []byte(strconv.FormatFloat(usd, 'g', -1, 64)))
		case err != nil:
			return err
		default:
			cur, perr := strconv.ParseFloat(string(e.Value()), 64)
			if perr != nil || math.IsNaN(cur) {
				cur = 0
			}
			_, err = kv.Update(ctx, key, []byte(strconv.FormatFloat(cur+usd, 'g', -1, 64)), e.Revision())
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
	return fmt.Errorf("admission: adding spend of %s: too much contention", tenant)
}

// extendPause sets a tenant's pause to until unless it is already later.
func extendPause(ctx context.Context, kv jetstream.KeyValue, tenant string, until time.Time) error {
	key := pauseKey(tenant)
	val := []byte(until.UTC().Format(time.RFC3339Nano))
	for range 20 {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = kv.Create(ctx, key, val)
		case err != nil:
			return err
		default:
			if cur, perr := time.Parse(time.RFC3339Nano, string(e.Value())); perr == nil && !cur.Before(until) {
				return nil
			}
			_, err = kv.Update(ctx, key, val, e.Revision())
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
	return fmt.Errorf("admission: pausing %s: too much contention", tenant)
}

// State reads what admission keeps per tenant in FLEET_ADMISSION (spend per
// window, rate-limit pauses), for operators (`dispatcher tenant get`,
// `tenant resume`).
type State struct {
	kv jetstream.KeyValue
}

// OpenState opens the admission bucket (`dispatcher serve` makes it).
func OpenState(ctx context.Context, js jetstream.JetStream, names protocol.Names) (*State, error) {
	kv, err := js.KeyValue(ctx, names.AdmissionBucket())
	if err != nil {
		return nil, fmt.Errorf("admission: bucket %s: %w", names.AdmissionBucket(), err)
	}
	return &State{kv: kv}, nil
}

// Spent is a tenant's recorded spend in the window of length window that
// holds now, and that window's start.
func (s *State) Spent(ctx context.Context, tenant string, window time.Duration, now time.Time) (usd float64, start time.Time, err error) {
	start = WindowStart(now, window)
	e, err := s.kv.Get(ctx, spendKey(tenant, start))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, start, nil
	}
	if err != nil {
		return 0, start, err
	}
	usd, err = strconv.ParseFloat(string(e.Value()), 64)
	return usd, start, err
}

// PausedUntil is the end of a tenant's rate-limit pause (zero: none; a
// pause already over counts as none).
func (s *State) PausedUntil(ctx context.Context, tenant string, now time.Time) (time.Time, error) {
	e, err := s.kv.Get(ctx, pauseKey(tenant))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	until, err := time.Parse(time.RFC3339Nano, string(e.Value()))
	if err != nil || !until.After(now) {
		return time.Time{}, err
	}
	return until, nil
}

// Resume ends a tenant's rate-limit pause now (every admitter watches the
// key); resumed is false when there was none.
func (s *State) Resume(ctx context.Context, tenant string) (resumed bool, err error) {
	if _, err := s.kv.Get(ctx, pauseKey(tenant)); errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	return true, s.kv.Delete(ctx, pauseKey(tenant))
}
