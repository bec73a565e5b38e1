package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/relay"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

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
	var job *protocol.Job
	if err == nil {
		job, err = protocol.DecodeJob(msg.Headers().Get(protocol.HeaderContentType), msg.Data())
	}
	if err == nil {
		err = job.Validate(tenant, true)
	}
	var env map[string]string
	if err == nil {
		env, err = w.envFor(job)
	}
	if err != nil {
		w.reject(msg, job, tenant, attempt, err)
		return
	}
	log := w.log.With().Str("tenant", job.Tenant).Str("query_id", job.ID).Int("attempt", attempt).Logger()

	provider := w.providerFor(job)
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
	q := &query{w: w, msg: msg, job: job, attempt: attempt, log: log, runEnded: runEnded, ackWait: ackWait,
		runCtx: runCtx, cancelRun: cancelRun}
	q.since = time.Now()
	defer w.active.add(q)()
	defer w.trackRun(job, attempt)()
	q.run(provider, env)
}

// reject terminates an invalid job and, when its id and tenant are
// readable, publishes a failed status with code invalid_job.
func (w *Worker) reject(msg jetstream.Msg, job *protocol.Job, tenant string, attempt int, cause error) {
	id := ""
	if job != nil {
		id = job.ID
		if job.Tenant != "" && protocol.ValidTenant(job.Tenant) && tenant == "" {
			tenant = job.Tenant
		}
	}
	if id == "" {
		id, _ = protocol.ProbeIdentity(msg.Headers().Get(protocol.HeaderContentType), msg.Data())
	}
	reason := cause.Error()
	if len(reason) > 512 {
		reason = reason[:512]
	}
	w.log.Warn().Str("tenant", tenant).Str("query_id", id).Str("reason", reason).Msg("invalid job; terminating it")
	dctx, dcancel := context.WithTimeout(context.Background(), apiTimeout)
	err := w.deadLetter(dctx, msg, tenant, reason)
	dcancel()
	if err != nil {
		// Terminated now, it would be lost: keep it until it can be copied.
		w.log.Error().Err(err).Msg("dead-lettering an invalid job; it stays queued")
		_ = msg.NakWithDelay(backoff(uint64(attempt)))
		return
	}
	if err := msg.TermWithReason(reason); err != nil {
		w.log.Error().Err(err).Msg("terminating an invalid job")
	}
	w.metrics.jobs.WithLabelValues("invalid").Inc()
	if !protocol.ValidID(id) || !protocol.ValidTenant(tenant) {
		return
	}
	ev := protocol.StatusEvent{
		ID: id, Tenant: tenant, State: protocol.StateFailed, Attempt: attempt,
		Error: &protocol.ErrorInfo{Code: protocol.CodeInvalidJob, Message: reason},
	}
	ev.JobSeq = jobSeqOf(msg)
	if job != nil {
		ev.Metadata = job.Metadata
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := w.publishStatus(ctx, ev); err != nil {
		w.log.Error().Err(err).Msg("publishing the invalid_job status")
	}
}

func (w *Worker) publishStatus(ctx context.Context, ev protocol.StatusEvent) error {
	m, err := w.statusMsg(ev)
	if err != nil {
		return err
	}
	_, err = w.js.PublishMsg(ctx, m)
	return err
}

func (w *Worker) statusMsg(ev protocol.StatusEvent) (*nats.Msg, error) {
	ev.V = protocol.SchemaVersion
	ev.Worker = w.cfg.ID
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(w.names.QueryStatus(ev.Tenant, ev.ID))
	m.Data = b
	m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	return m, nil
}

// query is one attempt of one job on this worker.
type query struct {
	w       *Worker
	msg     jetstream.Msg
	job     *protocol.Job
	attempt int
	log     zerolog.Logger
	fenced  atomic.Bool
	// fencedV is the verdict that fenced the run, when the code that saw
	// it knew it (setFenced); Proceed when only the relay's refusal did.
	fencedV atomic.Int32
	// artifact and wsStatus are a workspace job's capture (workspace.go).
	artifact *protocol.Artifact
	wsStatus *protocol.WorkspaceStatus
	// runEnded frees the worker slot once the agent has exited.
	runEnded func()
	ackWait  time.Duration
	// fw publishes this attempt's statuses through the fence (set by claim).
	fw *fence.Writer
	// sess is set for session jobs (session.go); resumeRefused when
	// options.resume named nothing of the tenant.
	sess          *sessionRun
	resumeRefused bool
	// runCtx is cancelled (cancelRun) by a cancel, a hand-back or a fence.
	runCtx    context.Context
	cancelRun context.CancelCauseFunc
	runFlags
}

func (q *query) run(provider sandbox.Provider, env map[string]string) {
	w, job := q.w, q.job
	ctx := context.Background()
	started := time.Now()

	// A cancel reaches this run through the worker-wide .ctl subscription
	// (registered in handle, before the claim reads the .ctl history).
	runCtx := q.runCtx
	// The sandbox is made while the claim is in flight: nobody else sees
	// it, and the agent starts in it only once the claim is stored.
	sbReady := q.prepareSandbox(runCtx, provider)
	// Claim the query (package fence): the first status of this attempt is
	// a compare-and-set on the query's last status, and from then on no
	// older attempt can store a line or a status. Bounded, so a worker that
	// cannot reach the stream hands the job back instead of holding it.
	sctx, cancelStart := context.WithTimeout(ctx, w.cfg.ClaimTimeout)
	defer cancelStart()
	baseOf, cancelled, verdict, err := q.claim(sctx)
	if err != nil || verdict != fence.Proceed || cancelled {
		q.discardSandbox(sbReady)
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
			q.discardSandbox(sbReady)
		}
		_, _ = baseOf()
		q.retry(fmt.Errorf("opening the journal: %w", err), "")
		return
	}
	window := w.cfg.PublishWindow
	if w.queriesReplicated(ctx) {
		// A replicated stream rejects a second line checked against the
		// status subject while the first is still being proposed.
		window = 1
	}
	// The relay starts at the first line, once the Fleet-Seq read begun
	// by the claim has answered (it ran while the sandbox was made).
	var rel *relay.Relay
	var baseErr error
	startRelay := func() error {
		if rel != nil || baseErr != nil {
			return baseErr
		}
		base, err := baseOf()
		if err != nil {
			baseErr = err
			return err
		}
		rel = relay.New(relay.Config{
			Pub: w.pub, NC: w.cfg.NC, Stream: w.names.QueriesStream(), Subject: w.names.QueryMsg(job.Tenant, job.ID),
			Tenant: job.Tenant, ID: job.ID, Attempt: q.attempt, MaxPayload: w.cfg.LineLimit(), Journal: jl,
			Metrics: w.metrics.relay, Log: q.log, Window: window, MaxQueued: w.cfg.QueueBytes, Base: base,
			Fence: q.fw, Hint: q.fenced.Load, Timeout: w.cfg.PublishTimeout,
			Direct: w.direct, GroupMin: relay.GroupMin,
		})
		rel.Start(ctx)
		return nil
	}
	rateLimits := w.names.RateLimitSubject(job.Tenant)
	emit := func(l agent.Line) error {
		if err := startRelay(); err != nil {
			return err
		}
		if protocol.MayReportRateLimit(l.Raw) {
			// The admitter reads rate limits here, not from every line
			// (package admission); best effort, like its pause.
			_ = w.cfg.NC.Publish(rateLimits, l.Raw)
		}
		return rel.Emit(l.Raw)
	}

	var out agent.Outcome
	var runErr error
	if cancelled {
		out, runErr = q.cancelledBeforeStart(emit)
	} else {
		// "running" went out with the claim, except for a workspace job:
		// there it follows the checkout, with its start_sha.
		out, runErr = q.execute(runCtx, sbReady, env, emit)
	}
	if err := startRelay(); err != nil {
		// No line was journaled or sent: without the Fleet-Seq to
		// continue from, none can be.
		q.runEnded()
		_ = jl.Close(false)
		q.retry(err, "")
		return
	}
	q.runEnded()
	q.finish(rel, jl, out, runErr, started)
}

// finish is the one exit of a run whose relay and journal log are open:
// whatever the outcome, the relay is shut down (its goroutine has returned
// when finish does) and the journal log is closed, then the message is
// settled.
func (q *query) finish(rel *relay.Relay, jl journalCloser, out agent.Outcome, runErr error, started time.Time) {
	w := q.w
	ctx := context.Background()
	defer rel.Shutdown()
	switch q.outcomeOf(out, runErr) {
	case outcomeFenced:
		rel.Shutdown() // publishes nothing more; the journal has it all
		_ = jl.Close(false)
		q.stepAside(q.fencedBy(), "this run stopped relaying")
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
			if r != q && r.jobSeq() < q.jobSeq() && !r.fenced.Load() {
				r.log.Warn().Msg("a newer submission of the same id claimed the query on this worker; stopping this run")
				r.setFenced(fence.Replaced)
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

// flushed waits until every line of the run is in the stream. When they
// cannot all be, it closes the journal (not final: the next attempt or a
// restarted worker continues from it) and either steps aside (fenced: a
// later attempt owns the query) or hands the job back; it then reports
// false and the caller publishes nothing more. while names the step for
// the log.
func (q *query) flushed(ctx context.Context, rel *relay.Relay, jl journalCloser, while string) bool {
	err := rel.Flush(ctx)
	if err == nil {
		return true
	}
	_ = jl.Close(false)
	if errors.Is(err, relay.ErrFenced) {
		q.stepAside(q.fencedBy(), "fenced while "+while)
		return false
	}
	q.retry(fmt.Errorf("not every line reached the stream: %w", err), "")
	return false
}

// settle ends a run with a terminal outcome: every line in the stream, then
// the status, then the ack.
func (q *query) settle(rel *relay.Relay, jl journalCloser, out agent.Outcome, started time.Time) {
	w := q.w
	// The status is published only once every line of the attempt is
	// stored: if they cannot all be, the job is handed back and the next
	// attempt continues after what is stored.
	fctx, cancel := context.WithTimeout(context.Background(), w.cfg.FlushTimeout)
	defer cancel()
	if !q.flushed(fctx, rel, jl, "flushing") {
		return
	}
	if err := jl.Close(true); err != nil {
		q.log.Error().Err(err).Msg("closing the journal")
	}
	ev := q.adjustTerminal(terminalStatus(out))
	ev.Result.Lines = out.Lines
	ev.Result.LastSeq = rel.Seq()
	ev.Workspace = q.wsStatus
	q.publishArtifact(fctx)
	switch v, err := q.fw.Publish(fctx, q.event(ev)); {
	case err != nil:
		// Unknown whether it is stored: the next attempt reads it back
		// (and acks the job without running it if it is).
		q.retry(fmt.Errorf("publishing the terminal status: %w", err), "")
		return
	case v == fence.Superseded || v == fence.Replaced:
		q.stepAside(v, "before the terminal status")
		return
	case v == fence.Finished:
		q.log.Warn().Msg("another writer ended the query first; acking")
	}
	q.ack(context.Background())
	w.metrics.jobs.WithLabelValues(string(ev.State)).Inc()
	w.metrics.runDuration.Observe(time.Since(started).Seconds())
	q.log.Info().Str("state", string(ev.State)).Uint64("lines", out.Lines).Dur("took", time.Since(started)).Msg("job done")
}

// event fills in this attempt's fields of a status event.
func (q *query) event(ev protocol.StatusEvent) protocol.StatusEvent {
	ev.V = protocol.SchemaVersion
	ev.ID, ev.Tenant, ev.Attempt, ev.Metadata, ev.JobSeq = q.job.ID, q.job.Tenant, q.attempt, q.job.Metadata, q.jobSeq()
	ev.Worker = q.w.cfg.ID
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	return ev
}

// execute creates the sandbox and runs the agent in it.
func (q *query) execute(ctx context.Context, sbReady func() (sandbox.Sandbox, error), env map[string]string, emit agent.EmitFunc) (out agent.Outcome, err error) {
	w, job := q.w, q.job
	sb, err := sbReady()
	if err != nil {
		if ctx.Err() != nil {
			if errors.Is(context.Cause(ctx), agent.ErrHandback) {
				return agent.Outcome{HandedBack: true}, nil
			}
		}
		if sandbox.Retryable(err) || ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return agent.Outcome{}, fmt.Errorf("creating the sandbox: %w", err)
		}
		// A sandbox that cannot be made for this job: end the run with a
		// synthetic result through the runner's spawn-failure path.
		sb = failedSandbox{err: err}
	}
	// The sandbox is destroyed in the background once the run is over (its
	// processes are already gone), so the slot frees without waiting for
	// the directory to be removed; Stop waits for these.
	defer func() {
		w.cleanup.Go(func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := sb.Destroy(dctx); err != nil {
				q.log.Warn().Err(err).Msg("destroying the sandbox")
			}
		})
	}()
	if job.Workspace != nil {
		if _, failed := sb.(failedSandbox); !failed {
			base, early, ok, cerr := q.checkout(ctx, sb, emit)
			if !ok {
				return early, cerr
			}
			defer func() {
				if !q.fenced.Load() && !out.HandedBack && (err == nil || out.Result != nil) {
					q.capture(ctx, sb, base)
				}
			}()
		}
	}
	if hook := w.cfg.Test.RunStarted; hook != nil {
		hook(job.Tenant, job.ID, q.attempt)
	}
	var timeout time.Duration
	if job.Options.TimeoutS != nil {
		timeout = time.Duration(*job.Options.TimeoutS) * time.Second
	}
	if hook := w.cfg.Test.RunEnded; hook != nil {
		defer hook(job.Tenant, job.ID, q.attempt)
	}
	if job.Session != nil {
		return q.runSession(ctx, sb, env, emit)
	}
	return q.runOneShot(ctx, sb, agent.Request{
		Sandbox: sb, Job: job, Env: env, ProcID: "agent-" + strconv.Itoa(q.attempt), Timeout: timeout,
	}, emit)
}

// prepareSandbox starts making the run's sandbox and returns a function
// that waits for it.
func (q *query) prepareSandbox(ctx context.Context, provider sandbox.Provider) func() (sandbox.Sandbox, error) {
	type result struct {
		sb  sandbox.Sandbox
		err error
	}
	ch := make(chan result, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, q.w.cfg.CreateTimeout)
		defer cancel()
		sb, err := provider.Create(cctx, sandbox.Spec{ID: sandboxID(q.job, q.msgSeq(), q.attempt)})
		ch <- result{sb, err}
	}()
	return sync.OnceValues(func() (sandbox.Sandbox, error) {
		r := <-ch
		return r.sb, r.err
	})
}

// discardSandbox destroys a prepared sandbox the run will not use, in the
// background (Stop waits for it).
func (q *query) discardSandbox(sbReady func() (sandbox.Sandbox, error)) {
	q.w.cleanup.Go(func() {
		sb, err := sbReady()
		if err != nil {
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Destroy(dctx); err != nil {
			q.log.Warn().Err(err).Msg("destroying an unused sandbox")
		}
	})
}

// cancelledBeforeStart ends a query whose cancel arrived while it was queued:
// the agent never starts; the stream still ends with a (synthetic) result.
func (q *query) cancelledBeforeStart(emit agent.EmitFunc) (agent.Outcome, error) {
	return q.syntheticEnd(emit, protocol.ReasonCancelled, "worker: the query was cancelled before it started")
}

// retry hands the job back with a delay after an infrastructure failure.
func (q *query) retry(cause error, code string) {
	md, _ := q.msg.Metadata()
	var n uint64 = 1
	if md != nil {
		n = md.NumDelivered
	}
	d := backoff(n)
	q.log.Warn().Err(cause).Dur("delay", d).Msg("infrastructure failure; the job will be retried")
	if code != "" && q.fw != nil {
		// Through the fence: a fenced attempt's status is refused.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		_, err := q.fw.Publish(ctx, q.event(protocol.StatusEvent{
			State: protocol.StateRetrying,
			Error: &protocol.ErrorInfo{Code: code, Message: cause.Error()},
		}))
		cancel()
		if err != nil {
			q.log.Warn().Err(err).Msg("publishing the retrying status")
		}
	}
	_ = q.msg.NakWithDelay(d)
	q.w.metrics.jobs.WithLabelValues("retried").Inc()
}

// status publishes a status of this attempt through the fence (waiting
// for it). A fence that refuses it means a later attempt or another writer
// owns the query: the run is fenced.
func (q *query) status(ev protocol.StatusEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	v, err := q.fw.Publish(ctx, q.event(ev))
	switch {
	case err != nil:
		q.log.Error().Err(err).Str("state", string(ev.State)).Msg("publishing status")
	case v != fence.Proceed:
		q.setFenced(v)
	}
}

// setFenced marks the run fenced by verdict v.
func (q *query) setFenced(v fence.Verdict) {
	q.fencedV.Store(int32(v))
	q.fenced.Store(true)
}

// fencedBy is the verdict that fenced the run (Proceed: not known; see
// stepAside).
func (q *query) fencedBy() fence.Verdict { return fence.Verdict(q.fencedV.Load()) }

func sandboxID(job *protocol.Job, msgSeq uint64, attempt int) string {
	// The work message's sequence makes the name unique per run: a
	// session's continuation is a new message of the same query whose
	// delivery is attempt 1 again, created while the parked run's sandbox
	// may still be being destroyed in the background.
	id := job.Tenant + "-" + job.ID + "-" + strconv.FormatUint(msgSeq, 10) + "-" + strconv.Itoa(attempt)
	if len(id) > 128 {
		id = id[len(id)-128:]
	}
	return id
}

// failedSandbox stands for a sandbox that could not be created for a
// non-retryable reason: starting a process in it fails, which the runner
// reports as a spawn failure.
type failedSandbox struct{ err error }

func (f failedSandbox) ID() string { return "" }
func (f failedSandbox) Start(context.Context, sandbox.ProcSpec) (sandbox.Process, error) {
	return nil, fmt.Errorf("%w: %w", sandbox.ErrInvalid, f.err)
}
func (f failedSandbox) WriteFile(context.Context, string, []byte) error { return f.err }
func (f failedSandbox) ReadFile(context.Context, string) ([]byte, error) {
	return nil, f.err
}
func (f failedSandbox) Destroy(context.Context) error { return nil }
