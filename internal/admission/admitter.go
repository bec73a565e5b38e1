package admission

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// SpendConsumer is the durable consumer (on FLEET_QUERIES, status events)
// with which earlier versions added results' total_cost_usd to the
// tenants' spend; Start removes it. Spend now comes from the dispatcher's
// status index (RecordSpend), which reads the same events anyway.
const SpendConsumer = "dispatcher-spend"

const leaderKey = "leader"

// Config configures an Admitter.
type Config struct {
	// JS is the JetStream context; NC its connection. Required.
	JS jetstream.JetStream
	NC *nats.Conn
	// Names are the fleet's names.
	Names protocol.Names
	// Policy holds the defaults and the fleet cap (FleetCap is required).
	Policy Policy
	// Replicas of the KV buckets (as the fleet's streams: 3 on a cluster).
	// Defaults to 1.
	Replicas int
	// ID names this admitter in the leadership lease. Defaults to a fresh id.
	ID string
	// LeaseTTL is how long leadership outlives its holder's last renewal;
	// another dispatcher takes over within about LeaseTTL plus a retry
	// interval of LeaseTTL/5 after the leader dies. Defaults to 5s.
	LeaseTTL time.Duration
	// RateLimitPause is how long a tenant is paused after an API 429 or a
	// rejected rate limit without a reset time. Defaults to 60s.
	RateLimitPause time.Duration
	// Announce is how many of a waiting tenant's first jobs get a queued
	// status saying why they wait and where they are. Defaults to 5.
	Announce int
	// Tick is how often the leader reads the queue again with no wake-up
	// (see "Wake-ups" in the package doc). Defaults to 200ms.
	Tick time.Duration
	// Now is the clock of budget windows and rate-limit pauses (tests
	// inject one). Defaults to time.Now.
	Now func() time.Time
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

func (c Config) withDefaults() Config {
	c.ID = cmp.Or(c.ID, nuid.Next())
	c.LeaseTTL = cmp.Or(c.LeaseTTL, 5*time.Second)
	c.RateLimitPause = cmp.Or(c.RateLimitPause, time.Minute)
	c.Announce = cmp.Or(c.Announce, 5)
	c.Tick = cmp.Or(c.Tick, 200*time.Millisecond)
	c.Replicas = cmp.Or(c.Replicas, 1)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.JS == nil || c.NC == nil:
		return errors.New("admission: JS and NC are required")
	case c.Policy.FleetCap < 1:
		return errors.New("admission: Policy.FleetCap must be at least 1")
	case c.LeaseTTL < time.Second:
		return errors.New("admission: LeaseTTL must be at least 1s")
	}
	return c.Policy.Defaults.Validate()
}

// Admitter is the admission service of one dispatcher. Every admitter
// keeps the tenants' settings, spend and pauses (KV watchers) and records
// spend from results; only the one holding the leadership lease admits.
type Admitter struct {
	cfg   Config
	names protocol.Names
	log   zerolog.Logger

	stream  jetstream.Stream
	tenants jetstream.KeyValue
	state   jetstream.KeyValue
	lease   jetstream.KeyValue

	mu       sync.Mutex
	settings map[string]Settings
	spend    map[string]map[int64]float64
	pauses   map[string]time.Time
	// unrecorded is the cost of results the leader saw end (their status
	// on the core subject) that the spend in the KV bucket may not count
	// yet (see seenCost).
	unrecorded map[string][]unrecordedCost

	wake       chan struct{}
	jobPokes   atomic.Int64 // core messages seen on the jobs subjects
	endPokes   atomic.Int64 // statuses seen that end a run (terminal, parked)
	leading    atomic.Bool
	validUntil atomic.Int64 // unix ns: admit only before this (lease safety margin)
	workCap    atomic.Int64 // the work consumer's MaxAckPending, as last read (0: not yet)

	// Leader-only state, used by the lead goroutine alone.
	sched     *drr
	cursor    map[string]uint64
	moved     map[string]bool // subjects with admitted jobs not yet purged
	storedSeq uint64          // highest FLEET_JOBS sequence known stored
	heads     map[string][]head
	lastQueue map[string]int // per tenant: its queued jobs after the last pass
	announced map[uint64]announcement
	rounds    map[string]time.Time // per tenant: the last announcement round

	startMu  sync.Mutex
	started  bool
	stopping bool
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	stopped  chan struct{}
	spendKV  atomic.Pointer[jetstream.KeyValue] // a.state once Start made it, for RecordSpend
	watchers []jetstream.KeyWatcher
	pauseQ   chan pauseReq
}

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

type head struct {
	seq uint64
	id  string
}

// announcement is the last queued status published for a job.
type announcement struct {
	reason   string
	position int
	at       time.Time
}

// announceEvery is how often a tenant's waiting jobs are looked at for
// announcements, and positionEvery how often a waiting job's new place is
// announced when its reason stays the same (see "Why a job waits" in the
// package doc).
const (
	announceEvery = 200 * time.Millisecond
	positionEvery = time.Second
)

type pauseReq struct {
	tenant string
	until  time.Time
}

var errStopping = errors.New("admission: stopping")

// New returns an Admitter; Start starts it.
func New(cfg Config) (*Admitter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Admitter{
		cfg: cfg, names: cfg.Names,
		log:      cfg.Logger.With().Str("component", "admission").Str("admitter", cfg.ID).Logger(),
		settings: map[string]Settings{}, spend: map[string]map[int64]float64{}, pauses: map[string]time.Time{},
		unrecorded: map[string][]unrecordedCost{},
		wake:       make(chan struct{}, 1), stopped: make(chan struct{}), pauseQ: make(chan pauseReq, 256),
	}, nil
}

// SettingsOf returns the settings this admitter knows for tenant (from its
// watch of FLEET_TENANTS), and whether it has any.
func (a *Admitter) SettingsOf(tenant string) (Settings, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.settings[tenant]
	return s, ok
}

// Leading reports whether this admitter holds the leadership lease.
func (a *Admitter) Leading() bool { return a.leading.Load() }

// Stopped is closed once Stop has finished.
func (a *Admitter) Stopped() <-chan struct{} { return a.stopped }

// Start opens the buckets, loads settings, spend and pauses, starts the
// spend recorder and the campaign for leadership, and returns.
func (a *Admitter) Start(ctx context.Context) error {
	a.startMu.Lock()
	defer a.startMu.Unlock()
	if a.started || a.stopping {
		return nil
	}
	n := a.names
	var err error
	// Each request through provision.Retry: on a cluster a peer can be
	// offline for a moment, or the meta leader changing, when the
	// dispatcher starts (a CI run: "no suitable peers for placement, peer
	// offline" for FLEET_ADMITTER, the buckets before it made).
	err = provision.Retry(ctx, func(ctx context.Context) (err error) {
		a.stream, err = a.cfg.JS.Stream(ctx, n.JobsStream())
		return err
	})
	if err != nil {
		return fmt.Errorf("admission: stream %s: %w", n.JobsStream(), err)
	}
	if a.tenants, err = provision.KeyValue(ctx, a.cfg.JS, tenantsBucket(n, a.cfg.Replicas)); err != nil {
		return fmt.Errorf("admission: bucket %s: %w", n.TenantsBucket(), err)
	}
	if a.state, err = provision.KeyValue(ctx, a.cfg.JS, jetstream.KeyValueConfig{
		Bucket: n.AdmissionBucket(), Description: "agentfleet admission: spend per tenant and window, rate-limit pauses",
		Replicas: a.cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("admission: bucket %s: %w", n.AdmissionBucket(), err)
	}
	if a.lease, err = provision.KeyValue(ctx, a.cfg.JS, jetstream.KeyValueConfig{
		Bucket: n.AdmitterBucket(), Description: "agentfleet admitter leadership lease", TTL: a.cfg.LeaseTTL,
		Replicas: a.cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("admission: bucket %s: %w", n.AdmitterBucket(), err)
	}
	life, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	a.cancel = cancel
	for _, kv := range []jetstream.KeyValue{a.tenants, a.state} {
		w, err := kv.WatchAll(life)
		if err != nil {
			cancel(err)
			return fmt.Errorf("admission: watching %s: %w", kv.Bucket(), err)
		}
		a.watchers = append(a.watchers, w)
		// The initial values end with a nil entry; wait for it so the
		// first decision sees every setting.
		if err := a.applyInitial(ctx, kv.Bucket(), w); err != nil {
			cancel(err)
			return err
		}
		a.wg.Add(1)
		go a.watch(kv.Bucket(), w)
	}
	// Spend is recorded from the dispatcher's status index (RecordSpend);
	// the durable consumer earlier versions read it with goes.
	if err := a.cfg.JS.DeleteConsumer(ctx, n.QueriesStream(), SpendConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		a.log.Warn().Err(err).Str("consumer", SpendConsumer).Msg("removing the consumer earlier versions read spend with")
	}
	a.spendKV.Store(&a.state)
	a.wg.Add(2)
	go a.campaign(life)
	go a.pauser(life)
	a.started = true
	return nil
}

// Stop ends admitting (handing the lease back at once, so another
// dispatcher takes over without waiting for it to expire) and waits for
// every goroutine, limited by ctx. Shutdown order: the watchers (senders)
// first, then the campaign and pauser goroutines.
func (a *Admitter) Stop(ctx context.Context) error {
	a.startMu.Lock()
	if a.stopping {
		a.startMu.Unlock()
		select {
		case <-a.stopped:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	a.stopping = true
	started := a.started
	a.startMu.Unlock()
	if !started {
		close(a.stopped)
		return nil
	}
	for _, w := range a.watchers {
		_ = w.Stop()
	}
	a.cancel(errStopping)
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	close(a.stopped)
	return nil
}

func (a *Admitter) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
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
			a.apply(bucket, e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *Admitter) watch(bucket string, w jetstream.KeyWatcher) {
	defer a.wg.Done()
	for e := range w.Updates() {
		if e != nil {
			a.apply(bucket, e)
			a.poke()
		}
	}
}

func (a *Admitter) apply(bucket string, e jetstream.KeyValueEntry) {
	del := e.Operation() != jetstream.KeyValuePut
	a.mu.Lock()
	defer a.mu.Unlock()
	if bucket == a.names.TenantsBucket() {
		if del {
			delete(a.settings, e.Key())
			return
		}
		s, err := decodeSettings(e.Value())
		if err != nil {
			a.log.Warn().Err(err).Str("tenant", e.Key()).Msg("ignoring unreadable tenant settings")
			return
		}
		a.settings[e.Key()] = s
		return
	}
	kind, tenant, window, ok := parseStateKey(e.Key())
	switch {
	case !ok:
	case kind == "spend":
		if del {
			delete(a.spend[tenant], window)
			return
		}
		v, err := strconv.ParseFloat(string(e.Value()), 64)
		if err != nil {
			return
		}
		if a.spend[tenant] == nil {
			a.spend[tenant] = map[int64]float64{}
		}
		a.spend[tenant][window] = v
		// A seen cost is recorded once its window's spend has grown by
		// it since it was seen.
		a.unrecorded[tenant] = slices.DeleteFunc(a.unrecorded[tenant], func(u unrecordedCost) bool {
			return u.window == window && v >= u.base+u.cost-1e-9
		})
	case kind == "pause":
		if del {
			delete(a.pauses, tenant)
			return
		}
		if until, err := time.Parse(time.RFC3339Nano, string(e.Value())); err == nil {
			a.pauses[tenant] = until
		}
	}
}

// tenantState is what the policy needs of tenant t now.
func (a *Admitter) tenantState(t string, running int, now time.Time) Tenant {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.settings[t]
	eff := a.cfg.Policy.Effective(s)
	var spent float64
	if eff.BudgetUSD > 0 {
		w := WindowStart(now, time.Duration(eff.BudgetWindow)).Unix()
		spent = a.spend[t][w]
		for _, u := range a.unrecorded[t] {
			if u.window == w && now.Sub(u.at) < unrecordedFor {
				spent += u.cost
			}
		}
	}
	return Tenant{Name: t, Settings: s, Running: running, Spent: spent, PausedUntil: a.pauses[t]}
}

// seenCost counts the cost of a result the leader saw end (its terminal
// status on the core subject) against its tenant's budget at once. The
// worker acks the job right after that status, and the ack frees the slot
// a pass counts; the spend itself arrives later (the status index batches
// it into RecordSpend, then the KV write reaches this admitter's watcher).
// Without this, the pass that saw the slot free admitted the tenant's next
// job on the old spend, past a budget the result had reached.
func (a *Admitter) seenCost(data []byte) {
	// Most tenants have no budget: decide that before decoding the event.
	tenant, ok := jsonField(data, `"tenant":"`)
	if !ok || !protocol.ValidTenant(tenant) {
		return
	}
	a.mu.Lock()
	eff := a.cfg.Policy.Effective(a.settings[tenant])
	a.mu.Unlock()
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
	now := a.cfg.Now()
	w := WindowStart(now, time.Duration(eff.BudgetWindow)).Unix()
	a.mu.Lock()
	defer a.mu.Unlock()
	live := slices.DeleteFunc(a.unrecorded[tenant], func(u unrecordedCost) bool { return now.Sub(u.at) >= unrecordedFor })
	a.unrecorded[tenant] = append(live, unrecordedCost{window: w, cost: ev.Result.TotalCostUSD, base: a.spend[tenant][w], at: now})
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
		a.mu.Lock()
		eff := a.cfg.Policy.Effective(a.settings[ev.Tenant])
		a.mu.Unlock()
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

// pauser stores rate-limit pauses found in relayed lines, off the
// subscription's goroutine.
func (a *Admitter) pauser(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.pauseQ:
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := extendPause(pctx, a.state, p.tenant, p.until); err != nil {
				a.log.Warn().Err(err).Str("tenant", p.tenant).Msg("storing a rate-limit pause failed")
			} else {
				a.log.Info().Str("tenant", p.tenant).Time("until", p.until).Msg("tenant paused: rate limited")
			}
			cancel()
		}
	}
}

// onLine looks at one agent line a worker forwarded (protocol.RateLimitSubject)
// for a rejected rate limit.
func (a *Admitter) onLine(m *nats.Msg) {
	if !protocol.MayReportRateLimit(m.Data) {
		return
	}
	tenant, ok := a.names.ParseRateLimitSubject(m.Subject)
	if !ok {
		return
	}
	until, hit := RateLimitUntil(m.Data, a.cfg.Now(), a.cfg.RateLimitPause)
	if !hit {
		return
	}
	select {
	case a.pauseQ <- pauseReq{tenant: tenant, until: until}:
	default:
		a.log.Warn().Str("tenant", tenant).Msg("rate-limit pause queue full; dropping one")
	}
}

// RateLimitUntil reads one agent stdout line and reports whether it says
// the tenant's credential is rate limited, and until when: a
// rate_limit_event whose rate_limit_info.status is "rejected" (until its
// resetsAt, Unix seconds, or now+pause without one), a result with
// api_error_status 429, or an assistant error "rate_limit" (now+pause).
func RateLimitUntil(line []byte, now time.Time, pause time.Duration) (time.Time, bool) {
	var v struct {
		Type          string `json:"type"`
		RateLimitInfo *struct {
			Status   string  `json:"status"`
			ResetsAt float64 `json:"resetsAt"`
		} `json:"rate_limit_info"`
		APIErrorStatus any    `json:"api_error_status"`
		Error          string `json:"error"`
	}
	if json.Unmarshal(line, &v) != nil {
		return time.Time{}, false
	}
	switch {
	case v.Type == protocol.TypeRateLimitEvent && v.RateLimitInfo != nil && v.RateLimitInfo.Status == "rejected":
		if r := v.RateLimitInfo.ResetsAt; r > 0 && r < 1e11 {
			return time.Unix(int64(r), 0).UTC(), true
		}
		return now.Add(pause), true
	case v.Type == protocol.TypeResult && (v.APIErrorStatus == float64(429) || v.APIErrorStatus == "429"):
		return now.Add(pause), true
	case v.Type == protocol.TypeAssistant && v.Error == "rate_limit":
		return now.Add(pause), true
	}
	return time.Time{}, false
}

// campaign tries to take the leadership lease and admits while it holds it.
func (a *Admitter) campaign(ctx context.Context) {
	defer a.wg.Done()
	retry := a.cfg.LeaseTTL / 5
	for ctx.Err() == nil {
		at := time.Now()
		rev, err := a.lease.Create(ctx, leaderKey, []byte(a.cfg.ID))
		if errors.Is(err, jetstream.ErrKeyExists) {
			// Still ours (a renewal failed during a server failover, say):
			// take it back with a renewal rather than wait for it to expire.
			if e, gerr := a.lease.Get(ctx, leaderKey); gerr == nil && string(e.Value()) == a.cfg.ID {
				at = time.Now()
				rev, err = a.lease.Update(ctx, leaderKey, []byte(a.cfg.ID), e.Revision())
			}
		}
		if err == nil {
			a.lead(ctx, rev, at)
			continue
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("taking the admitter lease")
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// lead admits until the lease is lost or the admitter stops.
func (a *Admitter) lead(ctx context.Context, rev uint64, at time.Time) {
	lctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	ttl := a.cfg.LeaseTTL
	// Admit only within half the TTL of the last renewal (from when it was
	// sent): another dispatcher can take the lease only a whole TTL after.
	a.validUntil.Store(at.Add(ttl / 2).UnixNano())
	defer a.leading.Store(false)
	var rwg sync.WaitGroup
	rwg.Add(2)
	go func() {
		// Apart from the renewals, which a slow read must not delay; until
		// the first read, passes use this dispatcher's own cap.
		defer rwg.Done()
		t := time.NewTicker(ttl)
		defer t.Stop()
		for {
			a.readFleetCap(lctx)
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer rwg.Done()
		t := time.NewTicker(ttl / 5)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			at := time.Now()
			rctx, cancel := context.WithTimeout(lctx, ttl/3)
			r, err := a.lease.Update(rctx, leaderKey, []byte(a.cfg.ID), rev)
			cancel()
			if err != nil {
				if lctx.Err() == nil {
					a.log.Warn().Err(err).Msg("renewing the admitter lease failed; stopping admission")
					lost(err)
				}
				return
			}
			rev = r
			a.validUntil.Store(at.Add(ttl / 2).UnixNano())
		}
	}()
	n := a.names
	var subs []*nats.Subscription
	for subj, h := range map[string]nats.MsgHandler{
		n.JobsWildcard(): func(*nats.Msg) { a.jobPokes.Add(1); a.poke() },
		n.StatusWildcard(): func(m *nats.Msg) {
			// Only a run's end changes what a pass sees (a slot, a
			// tenant's spend); "running" and the like do not, and a pass
			// for each of them only read the queue again.
			if st, _ := statusState(m.Data); st.Terminal() || st == protocol.StateParked {
				if st.Terminal() {
					a.seenCost(m.Data) // as RecordSpend: terminal results only
				}
				a.endPokes.Add(1)
				a.poke()
			}
		},
		n.RateLimitWildcard(): a.onLine,
	} {
		s, err := a.cfg.NC.Subscribe(subj, h)
		if err != nil {
			a.log.Error().Err(err).Str("subject", subj).Msg("subscribing")
			lost(err)
			break
		}
		subs = append(subs, s)
	}
	// Leading once it listens: what reads Leading (tests, Admitting)
	// sees every subscription the leader makes already made.
	a.leading.Store(true)
	a.log.Info().Msg("admitting: this dispatcher holds the admitter lease")
	a.sched, a.cursor, a.heads, a.announced = newDRR(), map[string]uint64{}, map[string][]head{}, map[uint64]announcement{}
	a.lastQueue = nil
	a.rounds = map[string]time.Time{}
	a.moved, a.storedSeq = map[string]bool{}, 0
	tick := time.NewTicker(a.cfg.Tick)
	// A job's core message (the wake-up) can arrive before the stream has
	// stored the job: a pass then finds nothing new, and the job would
	// wait for the tick. So after a wake-up from a job, a pass that saw
	// nothing stored since the last one looks again soon, backing off
	// (1ms, doubling, up to 64ms; then the tick). A job dropped as a
	// duplicate costs those few passes.
	//
	// Likewise a run's end: its worker publishes the terminal (or parked)
	// status before it acks the work message, and the ack is what frees
	// the slot the pass counts. So after a wake-up from a run's end, a
	// pass that left jobs waiting and admitted none looks again the same
	// way, but backing off up to the tick or 2s, whichever is less: a
	// worker on a busy host can take longer than 64ms between the two,
	// and with a long tick the job would wait for it.
	var (
		seenPokes, seenEnds int64
		announced           bool // a job was announced that no pass has seen stored
		ending              bool // a run ended that no pass has seen free its slot
		backoff             time.Duration
		recheck             *time.Timer
	)
	for lctx.Err() == nil {
		pokes, ends := a.jobPokes.Load(), a.endPokes.Load()
		announced = announced || pokes != seenPokes
		ending = ending || ends != seenEnds
		seenPokes, seenEnds = pokes, ends
		res, err := a.pass(lctx)
		if err != nil && lctx.Err() == nil {
			a.log.Warn().Err(err).Msg("admission pass failed; retrying")
		}
		if res.fresh {
			announced = false
		}
		if res.admitted > 0 || !res.held {
			ending = false
		}
		var again <-chan time.Time
		switch {
		case err != nil || (!announced && !ending):
			announced, ending, backoff = false, false, 0
		case backoff >= 64*time.Millisecond && (!ending || backoff >= min(a.cfg.Tick, 2*time.Second)):
			announced, ending, backoff = false, false, 0 // the tick looks again
		default:
			backoff = max(2*backoff, time.Millisecond)
			if recheck == nil {
				recheck = time.NewTimer(backoff)
			} else {
				recheck.Reset(backoff)
			}
			again = recheck.C
		}
		select {
		case <-lctx.Done():
		case <-a.wake:
		case <-tick.C:
		case <-again:
		}
	}
	if recheck != nil {
		recheck.Stop()
	}
	tick.Stop()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	lost(nil)
	rwg.Wait()
	if errors.Is(context.Cause(ctx), errStopping) {
		// Hand the lease over at once.
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = a.lease.Delete(dctx, leaderKey, jetstream.LastRevision(rev))
		cancel()
	}
	a.log.Info().Msg("no longer admitting")
}

func (a *Admitter) leaseValid() bool { return time.Now().UnixNano() < a.validUntil.Load() }

// passResult is what a pass saw and did.
type passResult struct {
	// fresh: the stream had stored something this leader had not seen.
	fresh bool
	// admitted: jobs moved to the work subjects.
	admitted int
	// held: jobs were left waiting (caps, budgets, pauses).
	held bool
}

// pass reads the queue and run counts from the stream and admits what the
// policy allows, then says why the rest waits.
func (a *Admitter) pass(ctx context.Context) (res passResult, err error) {
	n := a.names
	defer a.purgeMoved(ctx)
	info, err := a.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return res, fmt.Errorf("reading %s: %w", n.JobsStream(), err)
	}
	res.fresh = info.State.LastSeq > a.storedSeq
	a.storedSeq = max(a.storedSeq, info.State.LastSeq)
	queued, running := map[string]int{}, map[string]int{}
	total := 0
	jobsPrefix, workPrefix := n.Prefix()+".jobs.", n.Prefix()+".work."
	var invalid []string
	for subj, c := range info.State.Subjects {
		switch {
		case strings.HasPrefix(subj, workPrefix):
			total += int(c)
			if t, ok := n.ParseWorkSubject(subj); ok {
				running[t] += int(c)
			}
		case strings.HasPrefix(subj, jobsPrefix):
			t := subj[len(jobsPrefix):]
			if protocol.ValidTenant(t) {
				queued[t] += int(c)
			} else {
				invalid = append(invalid, subj)
			}
		}
	}
	// Jobs on a subject with no valid tenant pass unadmitted: the worker
	// rejects them as it always did.
	for _, subj := range invalid {
		for {
			moved, err := a.move(ctx, subj, subj[len(jobsPrefix):], n.Prefix()+".work."+subj[len(jobsPrefix):])
			if err != nil || !moved {
				break
			}
		}
	}
	for t, c := range queued {
		if c < a.lastQueue[t] {
			// Fewer queued than this admitter left: a job was removed
			// by someone else (the dispatcher's cancel of a queued
			// job). The cached heads may hold it: read them again, and
			// announce the new places now.
			delete(a.heads, t)
			delete(a.rounds, t)
		}
	}
	defer func() { a.lastQueue = queued }() // after this pass's moves
	now := a.cfg.Now()
	// The fleet's cap is the work consumer's MaxAckPending (the dispatcher
	// started last set it), not this dispatcher's flag.
	pol := a.cfg.Policy
	pol.FleetCap = a.FleetCap()
	active := make([]string, 0, len(queued))
	for t, c := range queued {
		if c > 0 {
			active = append(active, t)
		}
	}
	eligible := func(t string) bool {
		return queued[t] > 0 && pol.Decide(a.tenantState(t, running[t], now), total, now).Admit
	}
	weight := func(t string) float64 { return a.cfg.Policy.Effective(a.tenantState(t, 0, now).Settings).Weight }
	for total < pol.FleetCap && a.leaseValid() {
		t := a.sched.next(active, eligible, weight)
		if t == "" {
			break
		}
		moved, err := a.move(ctx, n.JobSubject(t), t, n.WorkSubject(t))
		if err != nil {
			return res, err
		}
		if !moved {
			queued[t] = 0
			continue
		}
		res.admitted++
		queued[t]--
		running[t]++
		total++
	}
	for t, c := range queued {
		if c <= 0 {
			delete(a.heads, t)
			continue
		}
		res.held = true
		if wall := time.Now(); wall.Sub(a.rounds[t]) >= announceEvery {
			a.rounds[t] = wall
			d := pol.Decide(a.tenantState(t, running[t], now), total, now)
			reason := cmp.Or(d.Reason, protocol.ReasonFleetCap)
			if err := a.announce(ctx, t, reason, min(c, a.cfg.Announce)); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// FleetCap is the fleet's cap a pass admits up to: the work consumer's
// MaxAckPending, which is what workers are held to, once read while
// leading; until then Policy.FleetCap (this dispatcher's --max-concurrency).
func (a *Admitter) FleetCap() int {
	if c := a.workCap.Load(); c > 0 {
		return int(c)
	}
	return a.cfg.Policy.FleetCap
}

// readFleetCap reads the work consumer's MaxAckPending. Every dispatcher
// sets it when it starts (--max-concurrency), so one started with another
// value changes it for the whole fleet; the leader follows it, and says so
// when it differs from its own flag, instead of admitting jobs that wait
// on the work subjects with no reason given.
func (a *Admitter) readFleetCap(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := a.stream.Consumer(rctx, a.names.Consumer())
	if err != nil {
		return // kept as it was; read again a lease TTL later
	}
	n := int64(c.CachedInfo().Config.MaxAckPending)
	if n <= 0 {
		return
	}
	if old := a.workCap.Swap(n); old != n && int(n) != a.cfg.Policy.FleetCap {
		a.log.Warn().Int64("work_consumer_max_ack_pending", n).Int("max_concurrency", a.cfg.Policy.FleetCap).
			Msg("the fleet's cap is the work consumer's MaxAckPending, which another dispatcher's --max-concurrency set; admitting up to it (start every dispatcher with the same --max-concurrency)")
	}
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

// move admits the first job on subject from: it copies the job to the work
// subject to (Nats-Msg-Id "_admit.<seq>", so a copy made again after a
// failover is dropped as a duplicate); purgeMoved removes it from the
// queue at the end of the pass. It reports false when subject has no job.
func (a *Admitter) move(ctx context.Context, from, tenant, to string) (bool, error) {
	raw, err := a.stream.GetMsg(ctx, max(a.cursor[from], 1), jetstream.WithGetMsgSubject(from))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the next job of %s: %w", from, err)
	}
	wm := nats.NewMsg(to)
	wm.Data = raw.Data
	for k, v := range raw.Header {
		if !strings.HasPrefix(k, "Nats-") {
			wm.Header[k] = v
		}
	}
	seq := strconv.FormatUint(raw.Sequence, 10)
	wm.Header.Set(protocol.HeaderMsgID, "_admit."+seq)
	wm.Header.Set(protocol.HeaderJobSeq, seq)
	wm.Header.Set(protocol.HeaderQueuedAt, raw.Time.UTC().Format(time.RFC3339Nano))
	ack, err := a.cfg.JS.PublishMsg(ctx, wm)
	if err != nil {
		return false, fmt.Errorf("admitting job %s: %w", seq, err)
	}
	a.storedSeq = max(a.storedSeq, ack.Sequence) // our own copy is not news
	a.cursor[from] = raw.Sequence + 1
	a.moved[from] = true
	if h := a.heads[tenant]; len(h) > 0 && h[0].seq == raw.Sequence {
		a.heads[tenant] = h[1:]
	} else {
		delete(a.heads, tenant)
	}
	delete(a.announced, raw.Sequence)
	a.log.Debug().Str("tenant", tenant).Uint64("job_seq", raw.Sequence).Msg("admitted")
	return true, nil
}

// purgeMoved removes from the queue every job this leader admitted: one
// purge per subject, up to its cursor. Jobs leave a subject in order, so
// everything on it below the cursor was admitted (one delete per job
// cost a JSON API call each). A subject whose purge fails is tried again
// after the next pass; meanwhile the cursor keeps its jobs from being
// admitted twice, and a new leader's copies are dropped as duplicates.
func (a *Admitter) purgeMoved(ctx context.Context) {
	for subj := range a.moved {
		err := a.stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(a.cursor[subj]))
		if err != nil {
			a.log.Warn().Err(err).Str("subject", subj).Msg("removing admitted jobs from the queue; will retry")
			continue
		}
		delete(a.moved, subj)
	}
}

// announce publishes a queued status with reason and position for the
// first k jobs of tenant t whose reason or position changed.
func (a *Admitter) announce(ctx context.Context, t, reason string, k int) error {
	n := a.names
	hs := a.heads[t]
	for len(hs) < k {
		from := a.cursor[n.JobSubject(t)]
		if len(hs) > 0 {
			from = hs[len(hs)-1].seq + 1
		}
		raw, err := a.stream.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(n.JobSubject(t)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return err
		}
		id, _ := protocol.ProbeIdentity(raw.Header.Get(protocol.HeaderContentType), raw.Data)
		hs = append(hs, head{seq: raw.Sequence, id: id})
	}
	a.heads[t] = hs
	now := time.Now()
	for i, h := range hs[:min(k, len(hs))] {
		last, seen := a.announced[h.seq]
		switch {
		case !protocol.ValidID(h.id):
			continue
		case seen && last.reason == reason && (last.position == i+1 || now.Sub(last.at) < positionEvery):
			continue // nothing new, or only a place gained since the last second's announcement
		}
		ev := protocol.StatusEvent{V: protocol.SchemaVersion, ID: h.id, Tenant: t, State: protocol.StateQueued,
			JobSeq: h.seq, At: now.UTC(), Reason: reason, Position: i + 1}
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		pm := nats.NewMsg(n.QueryStatus(t, h.id))
		pm.Data = b
		pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		if _, err := a.cfg.JS.PublishMsg(ctx, pm); err != nil {
			return fmt.Errorf("publishing why %s/%s waits: %w", t, h.id, err)
		}
		a.announced[h.seq] = announcement{reason: reason, position: i + 1, at: now}
	}
	return nil
}
