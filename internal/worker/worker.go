// Package worker is the fleet's worker: it pulls query jobs from the work
// consumer, one per free slot, runs each in a sandbox with the agent runner,
// journals and relays every line the agent writes, publishes status events,
// and acks, naks or terms the job on its outcome.
//
// # An attempt and a mode
//
// Each job message is run by one attempt (query, job.go): it claims the
// query (claim.go), runs the job's mode with every agent line journaled
// and relayed (lines.go, package relay), and settles the message
// (settle.go, on the decision of outcome.go). How the agent runs is the
// mode's (mode.go): a one-shot run (oneshot.go) or a session (session.go,
// session_loop.go), wrapped by a workspace (workspace.go) that checks the
// repository out before and captures the work after. The agent's
// environment is decided in prepare.go (agentEnv), its process spec by the mode
// (agent.Request, session.Spec); the terminal status is made in settle.
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
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/jspub"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// Worker pulls and runs jobs. Its lifecycle is package startstop's: a
// second Start fails (already started), Start after Stop fails (stopped),
// and a second Stop returns the first one's result.
type Worker struct {
	cfg     Config
	js      jetstream.JetStream
	log     zerolog.Logger
	metrics *Metrics
	names   protocol.Names
	life    startstop.Base

	slots     chan struct{}
	finishing chan struct{} // jobs past their run, still finishing

	ready    atomic.Bool
	stopCh   chan struct{}
	loopDone chan struct{}

	// queries is what the worker knows of FLEET_QUERIES (replicas.go).
	queries *queries
	// direct receives the replies of the claims' multi-last reads.
	direct *directget.Mux
	// freed is signalled when a slot frees (the pull loop asks for more).
	freed chan struct{}

	jobs sync.WaitGroup
	// cleanup tracks sandbox destruction after runs.
	cleanup sync.WaitGroup
	// runs are the jobs being run, for Info (discovery.go).
	runs      sync.Map // tenant/id → protocol.RunningJob
	startedAt time.Time
	// handback cancels every run with agent.ErrHandback (shutdown phase 2).
	handbackCtx context.Context
	handback    context.CancelCauseFunc

	// active are the runs the worker-wide .ctl subscription and heartbeat
	// ticker act on (runs.go); ctlSub is that subscription.
	active active
	ctlSub *nats.Subscription
	// pub publishes the runs' lines (package jspub): one reply
	// subscription for every line's acknowledgement.
	pub *jspub.Publisher
	hb  heartbeat
	// warm is the pool of warm agents (warm.go), nil without Config.Warm.
	warm *warm.Pool
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
	w := &Worker{
		cfg:         cfg,
		js:          js,
		pub:         jspub.New(cfg.NC),
		direct:      directget.New(cfg.NC),
		log:         cfg.Logger.With().Str("component", "worker").Str("worker", cfg.ID).Logger(),
		metrics:     m,
		names:       cfg.Names,
		life:        startstop.Base{Name: "worker"},
		slots:       make(chan struct{}, cfg.Slots),
		finishing:   make(chan struct{}, cfg.Slots),
		stopCh:      make(chan struct{}),
		loopDone:    make(chan struct{}),
		handbackCtx: hctx,
		handback:    hcancel,
		freed:       make(chan struct{}, 1),
		hb:          heartbeat{every: cfg.Heartbeat, reset: make(chan struct{}, 1), done: make(chan struct{})},
	}
	if w.warm, err = newWarmPool(w); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.queries = &queries{js: js, name: cfg.Names.QueriesStream(), timeout: cfg.PublishTimeout,
		cleanup: &w.cleanup, stopping: w.life.Stopping}
	return w, nil
}

// ID is the worker's name.
func (w *Worker) ID() string { return w.cfg.ID }

// Ready reports whether the worker is connected, has found the work
// consumer, has room in its journal and is not shutting down.
func (w *Worker) Ready() bool { return w.NotReady() == nil }

// NotReady says why the worker does not take jobs now (nil when it does).
func (w *Worker) NotReady() error {
	switch {
	case w.life.Stopping():
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

// Start starts pulling. It returns at once; until the work consumer exists
// (the dispatcher creates it) the worker keeps looking for it.
func (w *Worker) Start(ctx context.Context) error { return w.life.Start(ctx, w.start) }

// Stop shuts down in two phases: stop pulling and let running jobs finish
// within ShutdownGrace; then stop the rest and hand their jobs back (Nak) so
// another worker continues them at once. ctx bounds the whole wait.
// A second Stop returns the first one's result; Stop before Start only
// marks the worker stopped.
func (w *Worker) Stop(ctx context.Context) error { return w.life.Stop(ctx, w.stop) }

// Started is closed once Start succeeded.
func (w *Worker) Started() <-chan struct{} { return w.life.Started() }

// Stopped is closed once Stop finished.
func (w *Worker) Stopped() <-chan struct{} { return w.life.Stopped() }

// start subscribes to every query's control subject and to the claims'
// read replies, and starts the heartbeat ticker and the pull loop. On an
// error it undoes what it began.
func (w *Worker) start(ctx context.Context) error {
	w.startedAt = time.Now().UTC()
	sub, err := w.subscribeCtl()
	if err != nil {
		return fmt.Errorf("worker: subscribing to the queries' control subjects: %w", err)
	}
	if err := w.direct.Subscribe(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("worker: subscribing to the claims' read replies: %w", err)
	}
	w.ctlSub = sub
	if c := w.cfg.EnvCache; c != nil {
		// The worker owns the environment cache's background work
		// (preparing copies to restore, docs/warm.md).
		if err := c.Start(context.WithoutCancel(ctx)); err != nil {
			_ = sub.Unsubscribe()
			return fmt.Errorf("worker: starting the environment cache: %w", err)
		}
	}
	if w.warm != nil {
		if err := w.warm.Start(context.WithoutCancel(ctx)); err != nil {
			_ = sub.Unsubscribe()
			if c := w.cfg.EnvCache; c != nil {
				_ = c.Stop(ctx)
			}
			return fmt.Errorf("worker: starting the warm agents: %w", err)
		}
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	w.hb.stop = stop
	go func() { defer close(w.hb.done); w.heartbeats(hctx) }()
	go w.loop(context.WithoutCancel(ctx))
	return nil
}

// stop is Stop's work on a started worker: phase one waits for the pull
// loop and the running jobs (ShutdownGrace), phase two hands the rest
// back; then the ticker, the subscriptions, the sandboxes being destroyed
// and the providers.
func (w *Worker) stop(ctx context.Context) error {
	close(w.stopCh)
	if w.warm != nil {
		// No job takes a warm agent any more: stop those not taken.
		if err := w.warm.Stop(ctx); err != nil {
			w.log.Warn().Err(err).Msg("stopping the warm agents")
		}
	}
	if c := w.cfg.EnvCache; c != nil {
		// No copy is prepared for the next job any more (the jobs still
		// running restore all the same, by copying when none is ready).
		if err := c.Stop(ctx); err != nil {
			w.log.Warn().Err(err).Msg("stopping the environment cache")
		}
	}
	select {
	case <-w.loopDone:
	case <-ctx.Done():
	}
	if err := w.drain(ctx); err != nil {
		return err
	}
	// Every job is over: the ticker and the .ctl subscription have no run
	// left to act on.
	w.hb.stop()
	<-w.hb.done
	_ = w.ctlSub.Unsubscribe()
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

// drain waits for the running jobs: ShutdownGrace to finish, then they
// are handed back (Nak) and waited for until ctx ends.
func (w *Worker) drain(ctx context.Context) error {
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
		return nil
	case <-ctx.Done():
		return fmt.Errorf("worker: jobs still running at shutdown: %w", ctx.Err())
	}
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
