package admission

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Budgets: every admitter keeps the tenants' settings, spend and pauses
// from the KV buckets, records spend from results, and counts the cost of
// results it saw end until their spend is recorded.

// unrecordedCost is one result's cost, seen before its spend is recorded.
type unrecordedCost struct {
	window int64     // the budget window it falls in (unix start)
	cost   float64   // its total_cost_usd
	base   float64   // the recorded spend of that window when it was seen
	at     time.Time // when it was seen
}

// unrecordedFor bounds how long a seen cost counts on its own: the status
// index records spend within moments; should the record of this cost have
// been in the spend already when it was seen (it then counts twice) or
// never come, the tenant is held at most this long for it.
const unrecordedFor = 30 * time.Second

// book is what an admitter knows of the tenants: their settings, spend per
// budget window and rate-limit pauses, as the KV watchers last applied
// them, and the cost of results seen to end but not recorded yet.
type book struct {
	names  protocol.Names
	policy Policy
	now    func() time.Time
	log    zerolog.Logger

	mu       sync.Mutex
	settings map[string]Settings
	spend    map[string]map[int64]float64
	pauses   map[string]time.Time
	// unrecorded is the cost of results the leader saw end (their status
	// on the core subject) that the spend in the KV bucket may not count
	// yet (see seenCost).
	unrecorded map[string][]unrecordedCost
}

func newBook(names protocol.Names, policy Policy, now func() time.Time, log zerolog.Logger) *book {
	return &book{
		names: names, policy: policy, now: now, log: log,
		settings: map[string]Settings{}, spend: map[string]map[int64]float64{}, pauses: map[string]time.Time{},
		unrecorded: map[string][]unrecordedCost{},
	}
}

func (b *book) settingsOf(tenant string) (Settings, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.settings[tenant]
	return s, ok
}

// effective is tenant's settings with the defaults filled in.
func (b *book) effective(tenant string) Settings {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.policy.Effective(b.settings[tenant])
}

func (a *Admitter) applyInitial(ctx context.Context, bucket string, w jetstream.KeyWatcher) error {
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("admission: watcher of %s closed", bucket)
			}
			if e == nil {
				return nil
			}
			a.book.apply(bucket, e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *Admitter) watch(bucket string, w jetstream.KeyWatcher) {
	defer a.wg.Done()
	for e := range w.Updates() {
		if e != nil {
			a.book.apply(bucket, e)
			a.poke()
		}
	}
}

func (b *book) apply(bucket string, e jetstream.KeyValueEntry) {
	del := e.Operation() != jetstream.KeyValuePut
	b.mu.Lock()
	defer b.mu.Unlock()
	if bucket == b.names.TenantsBucket() {
		if del {
			delete(b.settings, e.Key())
			return
		}
		s, err := decodeSettings(e.Value())
		if err != nil {
			b.log.Warn().Err(err).Str("tenant", e.Key()).Msg("ignoring unreadable tenant settings")
			return
		}
		b.settings[e.Key()] = s
		return
	}
	kind, tenant, window, ok := parseStateKey(e.Key())
	switch {
	case !ok:
	case kind == "spend":
		if del {
			delete(b.spend[tenant], window)
			return
		}
		v, err := strconv.ParseFloat(string(e.Value()), 64)
		if err != nil {
			return
		}
		if b.spend[tenant] == nil {
			b.spend[tenant] = map[int64]float64{}
		}
		b.spend[tenant][window] = v
		// A seen cost is recorded once its window's spend has grown by
		// it since it was seen.
		b.unrecorded[tenant] = slices.DeleteFunc(b.unrecorded[tenant], func(u unrecordedCost) bool {
			return u.window == window && v >= u.base+u.cost-1e-9
		})
	case kind == "pause":
		if del {
			delete(b.pauses, tenant)
			return
		}
		if until, err := time.Parse(time.RFC3339Nano, string(e.Value())); err == nil {
			b.pauses[tenant] = until
		}
	}
}

// tenant is what the policy needs of tenant t now.
func (b *book) tenant(t string, running int, now time.Time) Tenant {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.settings[t]
	eff := b.policy.Effective(s)
	var spent float64
	if eff.BudgetUSD > 0 {
		w := WindowStart(now, time.Duration(eff.BudgetWindow)).Unix()
		spent = b.spend[t][w]
		for _, u := range b.unrecorded[t] {
			if u.window == w && now.Sub(u.at) < unrecordedFor {
				spent += u.cost
			}
		}
	}
	return Tenant{Name: t, Settings: s, Running: running, Spent: spent, PausedUntil: b.pauses[t]}
}

// seenCost counts the cost of a result the leader saw end (its terminal
// status on the core subject) against its tenant's budget at once. The
// worker acks the job right after that status, and the ack frees the slot
// a pass counts; the spend itself arrives later (the status index batches
// it into RecordSpend, then the KV write reaches this admitter's watcher).
// Without this, the pass that saw the slot free admitted the tenant's next
// job on the old spend, past a budget the result had reached.
func (b *book) seenCost(data []byte) {
	// Most tenants have no budget: decide that before decoding the event.
	tenant, ok := jsonField(data, `"tenant":"`)
	if !ok || !protocol.ValidTenant(tenant) {
		return
	}
	b.mu.Lock()
	eff := b.policy.Effective(b.settings[tenant])
	b.mu.Unlock()
	if eff.BudgetUSD <= 0 {
		return
	}
	var ev struct {
		Result *struct {
			TotalCostUSD float64 `json:"total_cost_usd"`
		} `json:"result"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.Result == nil || !(ev.Result.TotalCostUSD > 0) {
		return
	}
	now := b.now()
	w := WindowStart(now, time.Duration(eff.BudgetWindow)).Unix()
	b.mu.Lock()
	defer b.mu.Unlock()
	live := slices.DeleteFunc(b.unrecorded[tenant], func(u unrecordedCost) bool { return now.Sub(u.at) >= unrecordedFor })
	b.unrecorded[tenant] = append(live, unrecordedCost{window: w, cost: ev.Result.TotalCostUSD, base: b.spend[tenant][w], at: now})
}

// RecordSpend adds the total_cost_usd of the terminal results among evs to
// their tenants' spend in the window each falls in: one compare-and-set
// per tenant and window for the whole batch. The dispatcher's status index
// calls it with each batch of status events it has stored. done[i] says
// whether evs[i] is dealt with (counted, or nothing to count); one that is
// not (Start has not made the bucket yet, or the write failed) should be
// delivered again. A write whose reply was lost is counted again on that
// redelivery, which errs toward stopping early.
func (a *Admitter) RecordSpend(ctx context.Context, evs []protocol.StatusEvent) (done []bool) {
	done = make([]bool, len(evs))
	type window struct {
		tenant string
		start  time.Time
	}
	sums := map[window]float64{}
	members := map[window][]int{}
	now := a.cfg.Now()
	for i, ev := range evs {
		if !ev.State.Terminal() || ev.Result == nil || !(ev.Result.TotalCostUSD > 0) || !protocol.ValidTenant(ev.Tenant) {
			done[i] = true
			continue
		}
		eff := a.book.effective(ev.Tenant)
		w := window{ev.Tenant, WindowStart(now, time.Duration(cmp.Or(eff.BudgetWindow, Duration(24*time.Hour))))}
		sums[w] += ev.Result.TotalCostUSD
		members[w] = append(members[w], i)
	}
	kv := a.spendKV.Load()
	if kv == nil {
		return done // not started: the costs wait for their redelivery
	}
	for w, usd := range sums {
		if err := addSpend(ctx, *kv, w.tenant, w.start, usd); err != nil {
			a.log.Warn().Err(err).Str("tenant", w.tenant).Msg("recording spend failed; will retry")
			continue
		}
		for _, i := range members[w] {
			done[i] = true
		}
	}
	return done
}

// statusState reads the "state" of a status event as the fleet encodes it
// (json.Marshal of protocol.StatusEvent: no spaces), without decoding the
// rest; ok is false when it has none.
func statusState(data []byte) (protocol.State, bool) {
	s, ok := jsonField(data, `"state":"`)
	return protocol.State(s), ok
}

// jsonField reads the string after key (`"name":"`) as the fleet encodes
// status events, without decoding the rest; ok is false when it has none.
func jsonField(data []byte, key string) (string, bool) {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return "", false
	}
	v := data[i+len(key):]
	j := bytes.IndexByte(v, '"')
	if j < 0 {
		return "", false
	}
	return string(v[:j]), true
}
