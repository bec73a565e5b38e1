package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// SpendConsumer is the durable consumer (on FLEET_QUERIES, status events)
// with which earlier versions added results' total_cost_usd to the
// tenants' spend; Start removes it. Spend now comes from the dispatcher's
// status index (RecordSpend), which reads the same events anyway.
const SpendConsumer = "dispatcher-spend"

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
	// Tracing makes a fleet.admit span per admitted job; nil is off.
	Tracing *tracing.Tracing
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
// keeps the tenants' settings, spend and pauses (KV watchers, the book)
// and records spend from results; only the one holding the leadership
// lease admits (lease.go), one pass at a time (pass.go).
type Admitter struct {
	startstop.Base

	cfg   Config
	names protocol.Names
	log   zerolog.Logger

	stream  jetstream.Stream
	tenants jetstream.KeyValue
	state   jetstream.KeyValue
	lease   jetstream.KeyValue

	// book holds the tenants' settings, spend and pauses (budget.go).
	book *book

	wake       chan struct{}
	jobPokes   atomic.Int64 // core messages seen on the jobs subjects
	endPokes   atomic.Int64 // statuses seen that end a run (terminal, parked)
	leading    atomic.Bool
	validUntil atomic.Int64 // unix ns: admit only before this (lease safety margin)
	workCap    atomic.Int64 // the work consumer's MaxAckPending, as last read (0: not yet)

	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	spendKV  atomic.Pointer[jetstream.KeyValue] // a.state once Start made it, for RecordSpend
	watchers []jetstream.KeyWatcher
	pauseQ   chan pauseReq
}

var errStopping = errors.New("admission: stopping")

// New returns an Admitter; Start starts it.
func New(cfg Config) (*Admitter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With().Str("component", "admission").Str("admitter", cfg.ID).Logger()
	return &Admitter{
		Base: startstop.Base{Name: "admission"},
		cfg:  cfg, names: cfg.Names, log: log,
		book: newBook(cfg.Names, cfg.Policy, cfg.Now, log),
		wake: make(chan struct{}, 1), pauseQ: make(chan pauseReq, 256),
	}, nil
}

// SettingsOf returns the settings this admitter knows for tenant (from its
// watch of FLEET_TENANTS), and whether it has any.
func (a *Admitter) SettingsOf(tenant string) (Settings, bool) { return a.book.settingsOf(tenant) }

// Leading reports whether this admitter holds the leadership lease.
func (a *Admitter) Leading() bool { return a.leading.Load() }

// Start opens the buckets, loads settings, spend and pauses, starts the
// spend recorder and the campaign for leadership, and returns. A Start
// that fails undoes what it began; see startstop for a second Start.
func (a *Admitter) Start(ctx context.Context) error { return a.Base.Start(ctx, a.start) }

// Stop ends admitting (handing the lease back at once, so another
// dispatcher takes over without waiting for it to expire) and waits for
// every goroutine, limited by ctx.
func (a *Admitter) Stop(ctx context.Context) error { return a.Base.Stop(ctx, a.halt) }

func (a *Admitter) start(ctx context.Context) error {
	if err := a.open(ctx); err != nil {
		return err
	}
	life, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	a.cancel = cancel
	for _, kv := range []jetstream.KeyValue{a.tenants, a.state} {
		if err := a.watchBucket(ctx, life, kv); err != nil {
			_ = a.halt(context.Background())
			return err
		}
	}
	// Spend is recorded from the dispatcher's status index (RecordSpend);
	// the durable consumer earlier versions read it with goes.
	n := a.names
	if err := a.cfg.JS.DeleteConsumer(ctx, n.QueriesStream(), SpendConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		a.log.Warn().Err(err).Str("consumer", SpendConsumer).Msg("removing the consumer earlier versions read spend with")
	}
	a.spendKV.Store(&a.state)
	a.wg.Add(2)
	go a.campaign(life)
	go a.pauser(life)
	return nil
}

// open finds the jobs stream and opens (or makes) the three buckets.
func (a *Admitter) open(ctx context.Context) error {
	n := a.names
	// Each request through provision.Retry: on a cluster a peer can be
	// offline for a moment, or the meta leader changing, when the
	// dispatcher starts (a CI run: "no suitable peers for placement, peer
	// offline" for FLEET_ADMITTER, the buckets before it made).
	err := provision.Retry(ctx, func(ctx context.Context) (err error) {
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
	return nil
}

// watchBucket watches kv into the book: it applies the initial values
// before it returns, so the first decision sees every setting, then
// follows the updates until Stop.
func (a *Admitter) watchBucket(ctx, life context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(life)
	if err != nil {
		return fmt.Errorf("admission: watching %s: %w", kv.Bucket(), err)
	}
	a.watchers = append(a.watchers, w)
	if err := a.applyInitial(ctx, kv.Bucket(), w); err != nil {
		return err
	}
	a.wg.Add(1)
	go a.watch(kv.Bucket(), w)
	return nil
}

// halt stops the watchers (senders) first, then the campaign and pauser
// goroutines, and waits for them, limited by ctx.
func (a *Admitter) halt(ctx context.Context) error {
	for _, w := range a.watchers {
		_ = w.Stop()
	}
	a.watchers = nil
	if a.cancel != nil {
		a.cancel(errStopping)
	}
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Admitter) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}
