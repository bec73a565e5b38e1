// Package worker is the fleet's worker: it pulls query jobs from the work
// consumer, one per free slot, runs each in a sandbox with the agent runner,
// journals and relays every line the agent writes, publishes status events,
// and acks, naks or terms the job on its outcome.
//
// # Pulling
//
// One pull request for as many jobs as there are free slots (package
// pull), on one inbox subscription per consumer lookup: whenever a slot
// frees, the worker asks for free slots minus the jobs it already asked
// for, so a busy worker holds no queued job and never prefetches. A slot
// is taken from the pull until the agent has exited; the job's last steps
// (flush, terminal status, ack) then finish without holding it, at most
// Slots jobs at once. Fleet-wide concurrency is the consumer's
// MaxAckPending, enforced by the server, which counts a job until its ack.
//
// # One subscription and one ticker per worker
//
// Per job the worker opens no subscription and starts no timer. One
// subscription on every query's .ctl subject (the wildcard) hands a cancel
// to the runs of that query on this worker (runs.go); a run registers
// before the claim reads the .ctl history, so a cancel is either in that
// history or delivered while the run is registered. One ticker sends
// InProgress for every running job each Heartbeat (AckWait/3) and, for
// runs older than one interval, rechecks the fence: a later attempt's
// claim already stops a run at its next line or status (the server
// refuses them), the recheck bounds how long a silent agent of a
// superseded attempt goes on. (There was a .status subscription per job
// for that; the fence made it a shortcut only.)
//
// # Starting a run
//
// The sandbox is made while the claim is in flight (nobody else can see
// it; it is destroyed if the claim says Finished, Superseded or Replaced,
// or a cancel is on record): the agent starts only once the claim is stored, so no
// agent runs for an attempt that does not own the query. The read of the
// last Fleet-Seq, which must come after the claim, runs while the sandbox
// finishes and the agent starts; the first line waits for it. Before the
// agent: one read of the last status (beside the .ctl history read) and
// the compare-and-set of "running", two round trips where there were
// three, with the sandbox's directories made meanwhile.
//
// A first attempt does read the last status before its claim. Claiming
// with a compare-and-set against "nothing on record" would save that read
// when nothing is on record, but core subscribers of .status see every
// publish, stored or refused, and with the dispatcher's "queued" on record
// (always, for jobs submitted through it) they would see a "running" that
// never was.
//
// # Outcomes
//
// A run that got as far as its relay ends through one exit (query.finish),
// which shuts the relay down and closes the journal log whatever the
// outcome; its switch takes the cases below in the reverse order, fenced
// first. Each run owns its goroutines (relay, the Fleet-Seq read, the
// sandbox's creation) and returns only once they have, so Stop, which
// waits for every run, waits for them; the worker's ticker and .ctl
// subscription end after the last run.
//
// Before anything runs, the run claims the query (package fence): its first
// status is a compare-and-set on the query's last status, bounded by
// ClaimTimeout (a worker that cannot reach the streams hands the job back
// rather than hold it). A claim that finds the submission's terminal
// status acks the job without running it; one that finds a later attempt
// leaves the message alone, and one that finds a newer submission of the
// same id terminates it (it will never run).
//
//   - terminal outcome (the agent's result, or a synthetic one): every line
//     of the attempt is stored in the stream (or the job is handed back),
//     then the terminal status is published through the fence, then Ack,
//     retried on short contexts until it is confirmed, a later attempt owns
//     the job, or AckWait has passed (the redelivery then finds the
//     terminal status and acks the job without running it).
//   - invalid job: TermWithReason, and a failed/invalid_job status when the id
//     and tenant are readable. Never retried.
//   - infrastructure failure (sandbox unavailable, NATS trouble at start):
//     NakWithDelay with backoff from the delivery count; the next attempt
//     continues the query's Fleet-Seq.
//   - shutdown: running jobs get ShutdownGrace to finish, then are stopped
//     and Nak'ed at once so another worker continues them.
//   - fenced: a later attempt of the same query claimed it (or another
//     writer ended it). The server refuses this run's next line or status;
//     a status subscription usually tells it sooner. It stops relaying and
//     leaves the message alone; if a newer submission of the same id is
//     what fenced it (fence.Replaced), it terminates the message instead,
//     so that it is neither redelivered nor dead-lettered (stepAside).
//
// # NATS faults
//
// Every publish has a PubAck timeout (PublishTimeout); the relay never lets
// nats.go resend a line behind newer ones, and after any failure it waits
// for its lines in flight, reads the stream back from the leader and sends
// again, in order, from the first line not stored. Pulls carry an idle
// heartbeat (PullHeartbeat), so a pull lost with a consumer leader is
// issued again after two missed heartbeats (a job that still arrives for
// it when no slot is free is handed back at once). The line size limit is read
// from the connection per run, after the first connect.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/jspub"
	"github.com/agentfleet/agentfleet/internal/pull"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// DefaultJournalSpillAfter is the worker's journal.Config.SpillAfter: a
// line the stream has not acknowledged this long after the agent wrote it
// goes to the local disk (NATS away or slow); on the happy path nothing is
// written.
const DefaultJournalSpillAfter = time.Second

// Config configures a Worker.
type Config struct {
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// Names builds subjects and stream names. Defaults to the default prefix.
	Names protocol.Names
	// ID names this worker in status events. Defaults to <hostname>-<random>.
	ID string
	// Slots is how many jobs run at once on this worker. Defaults to 4.
	Slots int
	// Providers are the sandbox providers by name ("local", "cloudflare").
	// At least one is required.
	Providers map[string]sandbox.Provider
	// DefaultSandbox is the provider for jobs that name none. Defaults to "local".
	DefaultSandbox string
	// OtherSandboxes names providers that this worker lacks but other
	// workers of the fleet have: a job for one of them is handed back (Nak)
	// for them to take. A job for a provider neither here nor in this list
	// fails at once (spawn_failed, saying which provider is missing) instead
	// of being redelivered until max_deliveries. Defaults to none.
	OtherSandboxes []string
	// Runner runs the agent. Required.
	Runner *agent.Runner
	// Journal keeps every line before it is published. Required.
	Journal *journal.Journal
	// LineLimit is the line size above which a line is relayed as a
	// pointer and stored whole: pass the same NewLineLimit to the journal
	// (journal.Config.LargeLineBytesFunc), which must agree. Defaults to
	// NewLineLimit(NC, Names.QueriesStream()).
	LineLimit func() int
	// Workspaces checks out and captures the repositories of jobs with a
	// workspace (SPEC 8). Nil fails such jobs with workspace_checkout.
	Workspaces *workspace.Workspaces
	// EnvAllow lists the names a job's options.env may set. Defaults to none.
	EnvAllow []string
	// ShutdownGrace is how long running jobs may finish on Stop before they
	// are handed back. Defaults to 30s.
	ShutdownGrace time.Duration
	// Heartbeat is the InProgress interval. Defaults to the consumer's AckWait/3.
	Heartbeat time.Duration
	// PublishWindow is how many async publishes a run keeps in flight.
	// Defaults to 256.
	PublishWindow int
	// QueueBytes bounds the bytes of each run's lines not yet stored in
	// the stream (queued or in flight); beyond it the agent's pipe waits.
	// Defaults to half the journal's default SpillBytes (2 MiB), so an
	// agent that writes faster than the stream stores is slowed to the
	// stream's pace rather than spilling its journal to disk; keep it
	// below the journal's SpillBytes.
	QueueBytes int
	// PublishTimeout bounds each publish's wait for its PubAck (a line
	// whose acknowledgement does not come in time fails, and the relay
	// recovers), each ack and each read of the stream; failures are
	// retried. Defaults to 5s.
	PublishTimeout time.Duration
	// ClaimTimeout bounds the start of a run (reading the query's state,
	// claiming it): a worker that cannot reach the stream in that time hands
	// the job back rather than hold it. Defaults to 30s.
	ClaimTimeout time.Duration
	// FlushTimeout bounds the wait for every line of a finished run to be
	// stored; past it the job is handed back. Defaults to 5m.
	FlushTimeout time.Duration
	// PullExpiry is the lifetime of each pull request, and PullHeartbeat
	// the server's idle heartbeat on it: a pull lost with a consumer leader
	// is noticed after two missed heartbeats and issued again. Default 10s
	// and 2s.
	PullExpiry, PullHeartbeat time.Duration
	// ConsumerRetry is how often to look for the work consumer while it does
	// not exist yet. Defaults to 1s.
	ConsumerRetry time.Duration
	// CreateTimeout bounds sandbox creation (cold starts). Defaults to 5m.
	CreateTimeout time.Duration
	// Metrics; nil creates unregistered ones.
	Metrics *Metrics
	// Logger; nil is Nop.
	Logger *zerolog.Logger
	// Sessions configures session jobs (SPEC 9); its Command is the agent
	// program (the same as the runner's). Session jobs fail to start while
	// Command is empty.
	Sessions session.Config
	// Checkpoints stores session checkpoints (queries/<tenant>/<id>/session/);
	// nil disables sessions and options.resume restores.
	Checkpoints storage.Store
	// Test hooks.
	Test TestConfig
}

// TestConfig holds test-only hooks.
type TestConfig struct {
	// RunStarted, if set, is called when a run's agent is about to start.
	RunStarted func(tenant, id string, attempt int)
	// RunEnded, if set, is called when a run's agent has ended.
	RunEnded func(tenant, id string, attempt int)
	// SessionIdle, if set, replaces every session's idle timeout.
	SessionIdle time.Duration
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%06x", cmp.Or(host, "worker"), rand.IntN(1<<24))
	}
	c.Slots = cmp.Or(c.Slots, 4)
	c.DefaultSandbox = cmp.Or(c.DefaultSandbox, protocol.SandboxLocal)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 30*time.Second)
	c.PublishWindow = cmp.Or(c.PublishWindow, 256)
	if c.LineLimit == nil && c.NC != nil {
		c.LineLimit = NewLineLimit(c.NC, c.Names.QueriesStream())
	}
	c.QueueBytes = cmp.Or(c.QueueBytes, journal.DefaultSpillBytes/2)
	c.ConsumerRetry = cmp.Or(c.ConsumerRetry, time.Second)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, 30*time.Second)
	c.FlushTimeout = cmp.Or(c.FlushTimeout, 5*time.Minute)
	c.PullExpiry = cmp.Or(c.PullExpiry, 10*time.Second)
	c.PullHeartbeat = cmp.Or(c.PullHeartbeat, 2*time.Second)
	c.CreateTimeout = cmp.Or(c.CreateTimeout, 5*time.Minute)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.NC == nil:
		return errors.New("worker: NC is required")
	case c.Runner == nil:
		return errors.New("worker: Runner is required")
	case c.Journal == nil:
		return errors.New("worker: Journal is required")
	case len(c.Providers) == 0:
		return errors.New("worker: at least one sandbox provider is required")
	case c.Providers[c.DefaultSandbox] == nil:
		return fmt.Errorf("worker: DefaultSandbox %q has no provider", c.DefaultSandbox)
	case c.Slots < 1 || c.Slots > 1024:
		return errors.New("worker: Slots must be between 1 and 1024")
	case c.ShutdownGrace < 0:
		return errors.New("worker: ShutdownGrace must not be negative")
	case c.PullHeartbeat*2 > c.PullExpiry:
		return errors.New("worker: PullHeartbeat must be at most half of PullExpiry")
	}
	return nil
}

// Worker pulls and runs jobs. Start it once; Stop it once.
type Worker struct {
	cfg     Config
	js      jetstream.JetStream
	log     zerolog.Logger
	metrics *Metrics
	names   protocol.Names

	slots     chan struct{}
	finishing chan struct{} // jobs past their run, still finishing

	ready    atomic.Bool
	stopping atomic.Bool
	stopCh   chan struct{}
	loopDone chan struct{}
	started  atomic.Bool
	stopOnce sync.Once
	stopErr  error

	mu      sync.Mutex
	queries jetstream.Stream
	// direct receives the replies of the claims' multi-last reads.
	direct *directget.Mux
	// replicas is FLEET_QUERIES' replica count (0 until read), read again
	// at most every replicasMaxAge (replicas.go).
	replicas   atomic.Int32
	replicasAt atomic.Int64
	replicasIn atomic.Bool
	// freed is signalled when a slot frees (the pull loop asks for more).
	freed chan struct{}

	jobs sync.WaitGroup
	// cleanup tracks sandbox destruction after runs.
	cleanup sync.WaitGroup
	// handback cancels every run with agent.ErrHandback (shutdown phase 2).
	// runs are the jobs being run, for Info (discovery.go).
	runs        sync.Map // tenant/id → protocol.RunningJob
	startedAt   time.Time
	handbackCtx context.Context
	handback    context.CancelCauseFunc

	// active are the runs the worker-wide .ctl subscription and heartbeat
	// ticker act on (runs.go); ctlSub is that subscription.
	active active
	ctlSub *nats.Subscription
	// pub publishes the runs' lines (package jspub): one reply
	// subscription for every line's acknowledgement.
	pub     *jspub.Publisher
	ackWait atomic.Int64 // the work consumer's AckWait, for the ticker
	hbReset chan struct{}
	hbStop  context.CancelFunc
	hbDone  chan struct{}
}

// New validates cfg and returns a Worker.
func New(cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Lines go out through package jspub (the relay); this context makes
	// the other publishes and API calls. A request sent to a dying
	// leader, or before a new one is elected, gets no reply at all: fail
	// it in time so it is retried.
	js, err := jetstream.New(cfg.NC, jetstream.WithDefaultTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil, cfg.Slots, nil)
	}
	hctx, hcancel := context.WithCancelCause(context.Background())
	return &Worker{
		cfg:         cfg,
		js:          js,
		pub:         jspub.New(cfg.NC),
		direct:      directget.New(cfg.NC),
		log:         cfg.Logger.With().Str("component", "worker").Str("worker", cfg.ID).Logger(),
		metrics:     m,
		names:       cfg.Names,
		slots:       make(chan struct{}, cfg.Slots),
		finishing:   make(chan struct{}, cfg.Slots),
		stopCh:      make(chan struct{}),
		loopDone:    make(chan struct{}),
		handbackCtx: hctx,
		handback:    hcancel,
		hbReset:     make(chan struct{}, 1),
		freed:       make(chan struct{}, 1),
		hbDone:      make(chan struct{}),
	}, nil
}

// ID is the worker's name.
func (w *Worker) ID() string { return w.cfg.ID }

// Ready reports whether the worker is connected, has found the work
// consumer, has room in its journal and is not shutting down.
func (w *Worker) Ready() bool { return w.NotReady() == nil }

// NotReady says why the worker does not take jobs now (nil when it does).
func (w *Worker) NotReady() error {
	switch {
	case w.stopping.Load():
		return errors.New("shutting down")
	case !w.cfg.NC.IsConnected():
		return errors.New("not connected to NATS")
	case !w.ready.Load():
		return errors.New("waiting for the work consumer")
	}
	if full, _ := w.cfg.Journal.Full(); full != nil {
		return fmt.Errorf("not pulling jobs: %w", full)
	}
	return nil
}

// holdWhileJournalFull keeps a job pulled just before the journal's disk
// filled (heartbeating it, so it is neither redelivered nor counted as a
// delivery) until the disk has room. It reports false when the worker stops
// first.
func (w *Worker) holdWhileJournalFull(msg jetstream.Msg, ackWait time.Duration) bool {
	full, recovered := w.cfg.Journal.Full()
	if full == nil {
		return true
	}
	w.metrics.relay.JournalFull.Set(1)
	w.log.Error().Err(full).Msg("holding a pulled job until the journal's disk has room")
	t := time.NewTicker(max(ackWait/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-recovered:
			w.metrics.relay.JournalFull.Set(0)
			return true
		case <-t.C:
			_ = msg.InProgress()
		case <-w.stopCh:
			return false
		}
	}
}

// waitJournalRoom holds the pull loop while the journal's disk is full:
// running jobs go on (their lines still reach NATS), no new one starts.
func (w *Worker) waitJournalRoom() {
	full, recovered := w.cfg.Journal.Full()
	if full == nil {
		w.metrics.relay.JournalFull.Set(0)
		return
	}
	w.metrics.relay.JournalFull.Set(1)
	w.log.Error().Err(full).Msg("not pulling jobs until the journal's disk has room; running jobs go on")
	select {
	case <-recovered:
		w.metrics.relay.JournalFull.Set(0)
		w.log.Info().Msg("the journal's disk has room again; pulling jobs")
	case <-w.stopCh:
	}
}

// Start starts pulling. It returns at once; until the work consumer exists
// (the dispatcher creates it) the worker keeps looking for it.
func (w *Worker) Start(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: already started")
	}
	w.startedAt = time.Now().UTC()
	sub, err := w.subscribeCtl()
	if err != nil {
		w.started.Store(false) // nothing runs: Stop has nothing to wait for
		return fmt.Errorf("worker: subscribing to the queries' control subjects: %w", err)
	}
	w.ctlSub = sub
	if err := w.direct.Subscribe(); err != nil {
		_ = sub.Unsubscribe()
		w.started.Store(false)
		return fmt.Errorf("worker: subscribing to the claims' read replies: %w", err)
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	w.hbStop = stop
	go func() { defer close(w.hbDone); w.heartbeats(hctx) }()
	go w.loop(context.WithoutCancel(ctx))
	return nil
}

// Stop shuts down in two phases: stop pulling and let running jobs finish
// within ShutdownGrace; then stop the rest and hand their jobs back (Nak) so
// another worker continues them at once. ctx bounds the whole wait.
// Safe to call more than once.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { w.stopErr = w.stop(ctx) })
	return w.stopErr
}

func (w *Worker) stop(ctx context.Context) error {
	w.stopping.Store(true)
	close(w.stopCh)
	if w.started.Load() {
		select {
		case <-w.loopDone:
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() { w.jobs.Wait(); close(done) }()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		w.log.Info().Msg("shutdown grace over; handing running jobs back")
		w.handback(agent.ErrHandback)
	case <-ctx.Done():
		w.handback(agent.ErrHandback)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("worker: jobs still running at shutdown: %w", ctx.Err())
	}
	// Every job is over: the ticker and the .ctl subscription have no run
	// left to act on.
	if w.started.Load() {
		w.hbStop()
		<-w.hbDone
		_ = w.ctlSub.Unsubscribe()
	}
	_ = w.pub.Close() // no relay publishes any more
	// Every job is over, so no sandbox destruction starts any more: wait for
	// those under way.
	cleaned := make(chan struct{})
	go func() { w.cleanup.Wait(); close(cleaned) }()
	select {
	case <-cleaned:
	case <-ctx.Done():
		return fmt.Errorf("worker: sandboxes still being destroyed at shutdown: %w", ctx.Err())
	}
	// What providers keep for later runs (the local provider's cgroups).
	for _, p := range w.cfg.Providers {
		if c, ok := p.(io.Closer); ok {
			_ = c.Close()
		}
	}
	return nil
}

func (w *Worker) loop(ctx context.Context) {
	defer close(w.loopDone)
	defer w.ready.Store(false)
	var waiting waitLog
	for !w.stopping.Load() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := w.js.Consumer(cctx, w.names.JobsStream(), w.names.Consumer())
		cancel()
		if err != nil {
			waiting.warn(w.log, w.cfg.NC, err, time.Now())
			select {
			case <-time.After(w.cfg.ConsumerRetry):
			case <-w.stopCh:
			}
			continue
		}
		waiting = waitLog{}
		ackWait := cons.CachedInfo().Config.AckWait
		w.setAckWait(ackWait)
		p, err := pull.New(w.cfg.NC, w.names.JobsStream(), w.names.Consumer(), 2*w.cfg.Slots+256, w.cfg.PullExpiry, w.cfg.PullHeartbeat)
		if err != nil {
			w.log.Error().Err(err).Msg("cannot pull from the work consumer")
			select {
			case <-time.After(w.cfg.ConsumerRetry):
			case <-w.stopCh:
			}
			continue
		}
		w.ready.Store(true)
		w.log.Info().Int("slots", w.cfg.Slots).Dur("ack_wait", ackWait).Msg("pulling jobs")
		err = w.pull(p, ackWait)
		p.Close()
		w.ready.Store(false)
		if err != nil {
			w.log.Warn().Err(err).Msg("pulling jobs; looking the work consumer up again")
		}
	}
}

// pull asks for as many jobs as there are free slots, in one pull request
// (not one per slot), and starts each job it is given, until the worker
// stops or the consumer is gone. A job given when no slot is free (a
// request thought lost that was answered after all) is handed back at once.
func (w *Worker) pull(p *pull.Puller, ackWait time.Duration) error {
	watch := time.NewTicker(p.Heartbeat())
	defer watch.Stop()
	for {
		if w.stopping.Load() {
			return nil
		}
		w.waitJournalRoom()
		if w.stopping.Load() {
			return nil
		}
		if free := cap(w.slots) - len(w.slots) - p.Pending(); free > 0 && w.cfg.NC.IsConnected() {
			if err := p.Ask(free); err != nil {
				w.log.Warn().Err(err).Msg("asking for jobs")
			}
		}
		select {
		case <-w.stopCh:
			return nil
		case <-w.freed:
		case now := <-watch.C:
			if p.Lost(now) {
				w.log.Warn().Msg("no answer to the pull request for two heartbeats; asking again")
			}
		case m := <-p.Msgs():
			if pull.IsStatus(m) {
				if err := p.Status(m); err != nil {
					if errors.Is(err, pull.ErrConsumerGone) {
						return err
					}
					w.log.Warn().Err(err).Msg("pulling jobs")
				}
				continue
			}
			w.start(p.Job(m), ackWait)
		}
	}
}

// start runs a job it was given in a free slot, or hands it back when
// there is none or the worker is stopping.
func (w *Worker) start(msg jetstream.Msg, ackWait time.Duration) {
	if w.stopping.Load() {
		_ = msg.Nak()
		return
	}
	select {
	case w.slots <- struct{}{}:
	default:
		_ = msg.Nak()
		return
	}
	if !w.holdWhileJournalFull(msg, ackWait) {
		_ = msg.Nak()
		<-w.slots
		return
	}
	w.metrics.running.Inc()
	w.metrics.freeSlots.Dec()
	w.jobs.Add(1)
	var once sync.Once
	// runEnded frees the slot once the agent has exited; the job's
	// bookkeeping (flush, terminal status, ack) may go on after it,
	// holding a finishing token instead, so at most Slots jobs finish
	// at once. Until it is acked the job still counts toward the
	// consumer's MaxAckPending, so fleet-wide concurrency stays exact.
	runEnded := func() {
		once.Do(func() {
			w.finishing <- struct{}{}
			w.metrics.running.Dec()
			w.metrics.freeSlots.Inc()
			<-w.slots
			select {
			case w.freed <- struct{}{}:
			default:
			}
		})
	}
	go func() {
		defer func() {
			runEnded()
			<-w.finishing
			w.jobs.Done()
		}()
		w.handle(msg, ackWait, runEnded)
	}()
}

// NewLineLimit returns the line size above which a line is relayed as a
// pointer and stored whole under its own key (the worker's relay and its
// journal must agree: give both the same function): LineLimit, or less
// when the stream has a smaller max message size (an operator may create
// FLEET_QUERIES with one; the stream refuses a larger message on every
// try). The stream's limit is read once, when first needed and NATS
// answers within two seconds; until then LineLimit alone counts. The
// connection's max payload is read at each call, so a worker started
// before its server learns it (and a reconnect to another server updates
// it).
func NewLineLimit(nc *nats.Conn, stream string) func() int {
	var streamMax atomic.Int64 // 0: not read yet; -1: none
	return func() int {
		limit := LineLimit(nc)
		sm := streamMax.Load()
		if sm == 0 {
			if js, err := jetstream.New(nc); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				st, err := js.Stream(ctx, stream)
				cancel()
				if err == nil {
					sm = int64(st.CachedInfo().Config.MaxMsgSize)
					if sm <= 0 {
						sm = -1
					}
					streamMax.Store(sm)
				}
			}
		}
		if sm > 0 {
			limit = min(limit, int(sm)-1024)
		}
		return max(limit, 1)
	}
}

// LineLimit is the line size above which a line is relayed as a pointer
// and stored whole under its own key, as far as the connection tells: its
// max payload minus room for headers, or 1 MiB's if it never connected.
func LineLimit(nc *nats.Conn) int {
	mp := nc.MaxPayload()
	if mp <= 0 {
		mp = 1 << 20
	}
	return int(mp) - 1024
}

// queriesReplicated reports whether FLEET_QUERIES has more than one replica.
func (w *Worker) queriesReplicated(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, w.cfg.PublishTimeout)
	defer cancel()
	st, err := w.queriesStream(cctx)
	if err != nil {
		return true // the safe choice: one line in flight
	}
	info := st.CachedInfo()
	return info == nil || info.Config.Replicas > 1
}

// envFor returns the job's extra environment, or a validation error naming
// a variable the operator did not allow.
func (w *Worker) envFor(job *protocol.Job) (map[string]string, error) {
	if len(job.Options.Env) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(job.Options.Env))
	for k, v := range job.Options.Env {
		if !slices.Contains(w.cfg.EnvAllow, k) {
			return nil, &protocol.ValidationError{Field: "options.env." + k, Reason: "not in the operator's allow-list"}
		}
		env[k] = v
	}
	return env, nil
}

// backoff is the NakWithDelay for an infrastructure failure on delivery n.
func backoff(n uint64) time.Duration {
	d := time.Second << min(n, 6)
	d = min(d, time.Minute)
	return d/2 + rand.N(d/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
