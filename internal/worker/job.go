package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/relay"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// A job's path through the worker, top to bottom:
//
//	handle      validate the message; its env, provider and mode        (this file, prepare.go)
//	query.run   sandbox made while the claim is in flight               (this file, sandbox.go)
//	  claim     first status as a compare-and-set; the Fleet-Seq read   (claim.go)
//	  execute   the mode runs the agent: oneShot or session, a
//	            workspace around either                                (mode.go, oneshot.go,
//	                                                                    session*.go, workspace.go)
//	  lines     every line journaled, then relayed                      (lines.go, package relay)
//	  finish    the outcome decides how the message is settled          (outcome.go, settle.go)

// apiTimeout bounds each JetStream API call of the job path.
const apiTimeout = 10 * time.Second

// handle runs one job message to its outcome.
// runEnded is called once the job no longer runs an agent (it may be
// called more than once).
func (w *Worker) handle(msg jetstream.Msg, ackWait time.Duration, runEnded func()) {
	md, err := msg.Metadata()
	if err != nil {
		w.log.Error().Err(err).Msg("job without metadata; terminating it")
		_ = msg.TermWithReason("no metadata")
		return
	}
	attempt := int(md.NumDelivered)
	if attempt > 1 {
		w.metrics.redeliveries.Inc()
	}

	tenant, err := w.names.ParseJobSubject(msg.Subject())
	if err != nil {
		err = badSubject(w.names, msg)
	}
	var job *protocol.Job
	if err == nil {
		job, err = protocol.DecodeJob(msg.Headers().Get(protocol.HeaderContentType), msg.Data())
	}
	if err == nil {
		err = job.Validate(tenant, true)
	}
	var env map[string]string
	if err == nil {
		env, err = agentEnv(job, w.cfg.EnvAllow)
	}
	if err == nil {
		_, err = w.jobNetwork(job)
	}
	if err == nil {
		_, err = jobLimits(job, w.cfg.LimitsMax)
	}
	if err == nil {
		_, err = stallTimeout(job, w.cfg.StallTimeout, w.cfg.StallTimeoutMax)
	}
	if err != nil {
		w.reject(msg, job, tenant, attempt, err)
		return
	}
	log := w.log.With().Str("tenant", job.Tenant).Str("query_id", job.ID).Int("attempt", attempt).Logger()

	provider := providerFor(w.cfg, job)
	if provider == nil {
		// Another worker of the fleet has this provider (Config.OtherSandboxes).
		log.Warn().Str("sandbox", job.Sandbox).Msg("no such sandbox provider on this worker; handing the job back")
		_ = msg.NakWithDelay(backoff(md.NumDelivered))
		w.metrics.jobs.WithLabelValues("retried").Inc()
		return
	}

	// From here on the job is ours: the worker's heartbeat ticker sends
	// InProgress for it well inside AckWait, and the worker-wide .ctl
	// subscription hands it a cancel, while it is registered (runs.go).
	runCtx, cancelRun := context.WithCancelCause(w.handbackCtx)
	defer cancelRun(nil)
	runCtx, span := startAttempt(w, runCtx, msg, job, attempt)
	q := &query{w: w, msg: msg, job: job, attempt: attempt, log: log, runEnded: runEnded, ackWait: ackWait,
		jobSeq: jobSeqOf(msg), queuedAt: queuedAtOf(msg), runCtx: runCtx, cancelRun: cancelRun}
	defer func() { endAttempt(span, q.lastStatus.Load()) }()
	q.mode = newMode(q, env)
	q.since = time.Now()
	defer w.active.add(q)()
	defer w.trackRun(job, attempt)()
	q.run(provider)
}

// msgSeqOf is the work message's own stream sequence (0 when unknown).
func msgSeqOf(msg jetstream.Msg) uint64 {
	if md, err := msg.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// jobSeqOf is the sequence of the job's submission: the admitter's
// Fleet-Job-Seq header on an admitted job, else the message's own.
func jobSeqOf(msg jetstream.Msg) uint64 {
	if v, err := strconv.ParseUint(msg.Headers().Get(protocol.HeaderJobSeq), 10, 64); err == nil && v > 0 {
		return v
	}
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// queuedAtOf is when the job's submission was stored: the admitter's
// Fleet-Queued-At header on an admitted job, else when it was stored in
// the work queue.
func queuedAtOf(msg jetstream.Msg) time.Time {
	if v, err := time.Parse(time.RFC3339Nano, msg.Headers().Get(protocol.HeaderQueuedAt)); err == nil {
		return v
	}
	md, err := msg.Metadata()
	if err != nil {
		return time.Time{}
	}
	return md.Timestamp
}

// query is one attempt of one job on this worker: it claims the query,
// runs the job's mode with its lines journaled and relayed, and settles
// the job message. How the agent runs is the mode's (mode.go).
type query struct {
	w       *Worker
	msg     jetstream.Msg
	job     *protocol.Job
	attempt int
	log     zerolog.Logger
	// jobSeq is the submission's sequence (jobSeqOf); queuedAt when it was
	// stored (queuedAtOf).
	jobSeq   uint64
	queuedAt time.Time
	// mode runs the agent: one-shot or session, a workspace around either.
	mode mode
	// fenced is set once a later attempt or another writer owns the query.
	fenced fenceState
	// runEnded frees the worker slot once the agent has exited.
	runEnded func()
	ackWait  time.Duration
	// fw publishes this attempt's statuses through the fence (set by claim).
	fw *fence.Writer
	// runCtx is cancelled (cancelRun) by a cancel, a hand-back or a fence.
	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	// warm is the warm agent this attempt took (warm.go), nil for a cold start.
	warm *warm.Agent
	// lastStatus is the last status published, for the attempt's span.
	lastStatus atomic.Pointer[protocol.StatusEvent]
	runFlags
}

// fenceState is whether a run is fenced, and by which verdict when the
// code that saw it knew it (Proceed when only the relay's refusal did).
type fenceState struct {
	fenced atomic.Bool
	v      atomic.Int32
}

// set marks the run fenced by verdict v.
func (f *fenceState) set(v fence.Verdict) {
	f.v.Store(int32(v))
	f.fenced.Store(true)
}

// is reports whether the run is fenced.
func (f *fenceState) is() bool { return f.fenced.Load() }

// by is the verdict that fenced the run (Proceed: not known; see
// stepAside).
func (f *fenceState) by() fence.Verdict { return fence.Verdict(f.v.Load()) }

// run is the attempt: claim, run the mode with the relay and journal,
// settle.
func (q *query) run(provider sandbox.Provider) {
	w := q.w
	ctx := context.Background()
	started := time.Now()

	// The sandbox is made while the claim is in flight: nobody else sees
	// it, and the agent starts in it only once the claim is stored.
	box := q.newRunBox(provider, q.withLimits(q.withNetwork(provider, sandboxSpec(q.job, msgSeqOf(q.msg), q.attempt))))
	// Claim the query (package fence): the first status of this attempt is
	// a compare-and-set on the query's last status, and from then on no
	// older attempt can store a line or a status. Bounded, so a worker that
	// cannot reach the stream hands the job back instead of holding it.
	sctx, cancelStart := context.WithTimeout(ctx, w.cfg.ClaimTimeout)
	defer cancelStart()
	baseOf, cancelled, verdict, err := q.claim(sctx)
	if err != nil || verdict != fence.Proceed || cancelled {
		box.discard()
	}
	switch {
	case err != nil:
		q.retry(fmt.Errorf("claiming the query: %w", err), "")
		return
	case verdict == fence.Finished:
		q.log.Warn().Msg("the job already has its terminal status; acking it without running it again")
		q.ack(ctx)
		w.metrics.jobs.WithLabelValues("duplicate").Inc()
		return
	case verdict != fence.Proceed:
		q.stepAside(verdict, "at the claim")
		return
	}
	cancelStart()
	q.claimed.Store(true)

	jl, err := q.openJournal(ctx)
	if err != nil {
		if !cancelled {
			box.discard()
		}
		_, _ = baseOf()
		q.retry(fmt.Errorf("opening the journal: %w", err), "")
		return
	}
	out := q.newLines(ctx, jl, baseOf)
	var res agent.Outcome
	var runErr error
	if cancelled {
		// The cancel arrived while the job was queued: the agent never
		// starts; the stream still ends with a (synthetic) result.
		res, runErr = syntheticEnd(out.emit, protocol.ReasonCancelled, "worker: the query was cancelled before it started")
	} else {
		// "running" went out with the claim, except for a workspace job:
		// there it follows the checkout, with its start_sha.
		res, runErr = q.execute(q.runCtx, box, out.emit)
	}
	if err := out.start(); err != nil {
		// No line was journaled or sent: without the Fleet-Seq to
		// continue from, none can be.
		q.runEnded()
		_ = jl.Close(false)
		q.retry(err, "")
		return
	}
	q.runEnded()
	q.finish(out.rel, jl, res, runErr, started)
}

// execute waits for the sandbox and runs the mode in it.
func (q *query) execute(ctx context.Context, box *box, emit agent.EmitFunc) (agent.Outcome, error) {
	sb, err := box.wait()
	if err != nil {
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), agent.ErrHandback) {
			return agent.Outcome{HandedBack: true}, nil
		}
		if sandbox.Retryable(err) || ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return agent.Outcome{}, fmt.Errorf("creating the sandbox: %w", err)
		}
		if bi, ok := sandbox.IsBridgeIncompatible(err); ok {
			// Every attempt would meet the same bridge: the query fails
			// once, saying which bridge and which worker.
			return syntheticEnd(emit, protocol.ReasonBridgeIncompatible, "worker: "+bi.Error())
		}
		// A sandbox that cannot be made for this job: end the run with a
		// synthetic result through the runner's spawn-failure path.
		sb = failedSandbox{err: err}
	}
	// The sandbox is destroyed in the background once the run is over (its
	// processes are already gone), so the slot frees without waiting for
	// the directory to be removed; Stop waits for these.
	defer box.destroy(sb)
	return q.mode.run(ctx, sb, emit)
}

// finish is the one exit of a run whose relay and journal log are open:
// whatever the outcome, the relay is shut down (its goroutine has returned
// when finish does) and the journal log is closed, then the message is
// settled.
func (q *query) finish(rel *relay.Relay, jl journalCloser, out agent.Outcome, runErr error, started time.Time) {
	w := q.w
	ctx := context.Background()
	defer rel.Shutdown()
	switch outcomeOf(q.fenced.is(), out, runErr, q.mode.parked()) {
	case outcomeFenced:
		rel.Shutdown() // publishes nothing more; the journal has it all
		_ = jl.Close(false)
		q.stepAside(q.fenced.by(), "this run stopped relaying")
	case outcomeHandback:
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = rel.Flush(fctx) // what was relayed so far; the journal has it all anyway
		cancel()
		_ = jl.Close(false)
		_ = q.msg.Nak()
		w.metrics.jobs.WithLabelValues("handed_back").Inc()
		q.log.Info().Msg("job handed back")
	case outcomeParked:
		q.park(rel, jl)
	case outcomeRetry:
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		_ = rel.Flush(fctx)
		cancel()
		_ = jl.Close(false)
		q.retry(runErr, protocol.CodeSandboxUnavailable)
	case outcomeTerminal:
		q.settle(rel, jl, out, started)
	}
}

// openJournal opens the attempt's journal log. A log of the same query and
// attempt number is still open on this worker only while an older
// submission of the same id runs here (a resubmission after the dedupe
// window): this run's claim has fenced it, so it is told to stop at once,
// and its log is waited for, up to ClaimTimeout, instead of handing this
// job back to run again as a spurious next attempt.
func (q *query) openJournal(ctx context.Context) (*journal.Log, error) {
	w, job := q.w, q.job
	deadline := time.Now().Add(w.cfg.ClaimTimeout)
	backoff := 10 * time.Millisecond
	for {
		jl, err := w.cfg.Journal.Open(job.Tenant, job.ID, q.attempt)
		if !errors.Is(err, journal.ErrExists) || time.Now().After(deadline) {
			return jl, err
		}
		for _, r := range w.active.of(job.Tenant, job.ID) {
			if r != q && r.jobSeq < q.jobSeq && !r.fenced.is() {
				r.log.Warn().Msg("a newer submission of the same id claimed the query on this worker; stopping this run")
				r.fenced.set(fence.Replaced)
				r.cancelRun(agent.ErrHandback)
			}
		}
		if err := sleepCtx(ctx, backoff); err != nil {
			return nil, err
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// journalCloser is what finish needs of a journal log.
type journalCloser interface {
	Close(final bool) error
}
