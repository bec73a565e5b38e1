package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// Session jobs (docs/sessions.md). The query's .ctl subject, as captured by
// FLEET_QUERIES, is the session's input log: an ordered consumer reads it
// from just after the last input whose turn ended (the checkpoint's
// InputSeq), or from the submission's time for a new session. Inputs queue
// here and are written one at a time, each after the previous turn's
// result; interrupt, approve and end act when they arrive. After every turn
// the checkpoint (Claude Code's transcript and InputSeq) is stored, so a
// worker that dies loses at most the turn in progress, which the next
// attempt runs again from its input.
//
// An agent that crashes mid-session (its process exits or is killed while
// the session runs; not end, not cancel, not a worker handing it back) is
// resumed in the same sandbox, up to maxCrashResumes times per attempt:
// the last checkpoint is restored in place of whatever the agent wrote
// since (so the conversation is exactly as of the last completed turn, and
// nothing of the crashed turn is in it), a new process resumes the session,
// and the crashed turn's input runs again, once. If the same input crashes
// the agent again it is not applied a third time: the session ends failed,
// naming the input. The crashed turn's output stays on .msg, ended by its
// synthetic result (process_exit), and counts as a turn.

// ctlEntry is one op read from the input log.
type ctlEntry struct {
	seq uint64
	op  protocol.CtlOp
}

// sessionRun is the state of one session attempt on this worker.
type sessionRun struct {
	q   *query
	env map[string]string
	sb  sandbox.Sandbox
	log zerolog.Logger

	cp       session.Checkpoint // what the next checkpoint says
	restored bool
	turns    int
	base     int    // turns of earlier processes (a restored session)
	lastSeq  uint64 // last .ctl sequence read
	ended    bool   // by an "end" op
	isParked bool

	// The running process.
	cur *session.Session
	// Processes started, and where they send their permission requests.
	procs int
	reqs  chan session.Request
	// The Claude session options.resume restored; refused when it named
	// nothing of the tenant.
	resumedFrom string
	refused     bool
	// Crash-resumes so far.
	crashes int
	// The input whose turn crashed last.
	crashedIn *queued
	// Why the session failed after crashes.
	crashNote string
	// The stall watch of the session's turns (nil: none).
	stall *stallWatch
	// Checkpoints that could not be stored since the last stored one, and
	// the last one's error.
	cpFailures int
	cpErr      error
}

// maxCrashResumes is how often a session attempt resumes its agent after
// a crash before it fails.
const maxCrashResumes = 3

// sessionStatus fills the session fields of a status event.
func (r *sessionRun) status(ev protocol.StatusEvent) protocol.StatusEvent {
	ev.Turn = r.turns
	ev.ClaudeSessionID = r.cp.ClaudeSessionID
	return ev
}

// run runs a session job in sb; see the comment at the top.
func (r *sessionRun) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (out agent.Outcome, err error) {
	q := r.q
	at := q.startAgent(ctx, r.env)
	emit = at.wrap(q, emit)
	defer func() { at.end(out, err) }()
	w, job := q.w, q.job
	r.sb = sb
	r.cp = session.Checkpoint{Job: job, JobSeq: q.jobSeq, QueuedAt: q.queuedAt}
	if d, err := stallTimeout(job, w.cfg.StallTimeout, w.cfg.StallTimeoutMax); err == nil && d > 0 {
		r.stall = newStallWatch(ctx, q, d, sb)
		emit = r.stall.wrap(emit)
	}

	fail := func(reason, msg string) (agent.Outcome, error) {
		return agent.EmitSynthetic(emit, agent.Outcome{}, protocol.SyntheticInput{Reason: reason, Message: msg})
	}
	store := w.cfg.Checkpoints
	if store == nil {
		return fail(protocol.ReasonSpawnFailed, "worker: this worker keeps no session checkpoints (no storage configured)")
	}
	// Where the session stands: a continuation or a later attempt restores
	// the checkpoint of this query.
	lctx, cancel := context.WithTimeout(ctx, apiTimeout)
	cp, err := session.Load(lctx, store, job.Tenant, job.ID)
	cancel()
	switch {
	case err == nil && (job.Session.Continuation || (q.attempt > 1 && cp.JobSeq == q.jobSeq)):
		r.cp = *cp
		r.cp.Job.Session.Continuation = false
		r.turns, r.base = cp.Turn, cp.Turn
		r.restored = true
	case err == nil || errors.Is(err, session.ErrNoCheckpoint):
		if job.Session.Continuation {
			return fail(protocol.ReasonSpawnFailed, "worker: the session has no checkpoint to continue from")
		}
	default:
		return agent.Outcome{}, fmt.Errorf("loading the session checkpoint: %w", err)
	}
	resume := ""
	if r.restored {
		resume = r.cp.ClaudeSessionID
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := session.RestoreCheckpoint(rctx, store, sb, job.Tenant, job.ID, &r.cp)
		cancel()
		if err != nil {
			return agent.Outcome{}, fmt.Errorf("restoring the session checkpoint: %w", err)
		}
	} else if job.Options.Resume != "" {
		res, err := restoreResume(ctx, q, sb, emit)
		r.refused = res.refused
		if res.done || err != nil {
			return res.out, err
		}
		resume = res.sid
		r.resumedFrom = res.sid
	}

	r.log.Debug().Bool("restored", r.restored).Uint64("input_seq", r.cp.InputSeq).Time("queued_at", r.cp.QueuedAt).Msg("session starting")
	// The input log.
	ops := make(chan ctlEntry, 256)
	stopLog, err := r.followInputs(ctx, ops)
	if err != nil {
		return agent.Outcome{}, fmt.Errorf("following the session's input log: %w", err)
	}
	defer stopLog()

	r.reqs = make(chan session.Request, 16)
	s, err := r.start(ctx, resume, emit)
	if err != nil {
		if sandbox.Retryable(err) && ctx.Err() == nil {
			return agent.Outcome{}, err
		}
		if c := stopCause(ctx); c != nil {
			if errors.Is(c, agent.ErrHandback) {
				return agent.Outcome{HandedBack: true}, nil
			}
			reason, msg := agent.ReasonFor(c)
			return fail(reason, msg)
		}
		return fail(protocol.ReasonSpawnFailed, "worker: the agent could not be started: "+err.Error())
	}
	r.cur = s
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		_ = r.cur.Close(cctx)
		cancel()
	}()
	return r.loop(ctx, s, ops, emit)
}

// start starts a session process: the one place the session agent's
// spec (its process spec, built by package session) is made.
func (r *sessionRun) start(ctx context.Context, resume string, emit agent.EmitFunc) (*session.Session, error) {
	q := r.q
	r.procs++
	id := fmt.Sprintf("session-%d", q.attempt)
	if r.procs > 1 {
		id = fmt.Sprintf("session-%d-r%d", q.attempt, r.procs-1)
	}
	spec := session.Spec{
		Sandbox: r.sb, Job: r.cp.Job, Env: r.env, ProcID: id, Resume: resume,
		OnRequest: func(req session.Request) {
			select {
			case r.reqs <- req:
			case <-ctx.Done():
			}
		},
	}
	if s, ok := r.adoptWarm(ctx, spec, emit); ok {
		return s, nil
	}
	return session.Start(ctx, q.w.cfg.Sessions, spec, emit)
}

// idleStatus is the idle status; it says when the last checkpoint could
// not be stored.
func (r *sessionRun) idleStatus() protocol.StatusEvent {
	ev := r.status(protocol.StatusEvent{State: protocol.StateIdle})
	if r.cpErr != nil {
		ev.Error = &protocol.ErrorInfo{Code: protocol.CodeCheckpointFailed,
			Message: "the session's checkpoint could not be stored, so it is not parked while idle: " + r.cpErr.Error()}
	}
	return ev
}

// recoverCrash resumes a session whose agent crashed during the turn of
// in: the last stored checkpoint (of this submission) is restored into the
// sandbox and a new process resumes it; the caller runs in again. ok is
// false when the session cannot be resumed (crashNote says why).
func (r *sessionRun) recoverCrash(ctx context.Context, in queued, out agent.Outcome, emit agent.EmitFunc) (*session.Session, bool) {
	q := r.q
	what := "the job's prompt"
	if in.seq > 0 {
		what = fmt.Sprintf("input %d (.ctl sequence)", in.seq)
	}
	exit := "it exited"
	if x := out.Exit; x != nil {
		if x.Signal != "" {
			exit = "it was killed by " + x.Signal
		} else {
			exit = fmt.Sprintf("it exited with code %d", x.Code)
		}
	}
	giveUp := func(why string) (*session.Session, bool) {
		r.crashNote = fmt.Sprintf("the agent crashed during the turn of %s (%s); %s", what, exit, why)
		r.log.Warn().Str("why", why).Msg("session not resumed after a crash")
		return nil, false
	}
	switch {
	case r.crashedIn != nil && *r.crashedIn == in:
		return giveUp(fmt.Sprintf("it crashed on this input before, so it is not applied again (%d resumes)", r.crashes))
	case r.crashes >= maxCrashResumes:
		return giveUp(fmt.Sprintf("gave up after %d resumes", r.crashes))
	case r.cpFailures > 0:
		return giveUp("the last turn's checkpoint could not be stored, so the session cannot be resumed exactly")
	}
	r.crashes++
	r.crashedIn = &in
	ns, why := r.restart(ctx, emit)
	if ns == nil {
		return giveUp(why)
	}
	msg := fmt.Sprintf("the agent crashed during the turn of %s (%s); resumed from the last checkpoint (resume %d of %d), the input runs again",
		what, exit, r.crashes, maxCrashResumes)
	r.log.Warn().Int("crashes", r.crashes).Uint64("ctl_seq", in.seq).Msg("agent crashed; session resumed")
	ev := r.status(protocol.StatusEvent{State: protocol.StateRunning})
	ev.Error = &protocol.ErrorInfo{Code: protocol.CodeProcessExit, Message: msg}
	q.status(ev)
	return ns, true
}

// restart starts a new process of the session in place of the one that
// ended mid-turn, resuming the last stored checkpoint (restored into the
// sandbox over whatever the ended turn left); why says what failed when
// ns is nil.
func (r *sessionRun) restart(ctx context.Context, emit agent.EmitFunc) (ns *session.Session, why string) {
	q := r.q
	fail := func(why string) (*session.Session, string) { return nil, why }
	resume := ""
	// What the last completed turn left: the stored checkpoint of this
	// submission (a session that crashed in its first turn has none, and
	// starts again).
	if r.cp.PromptApplied || r.restored || r.resumedFrom != "" {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if r.cp.PromptApplied || r.restored {
			cp, err := session.Load(lctx, q.w.cfg.Checkpoints, q.job.Tenant, q.job.ID)
			if err != nil {
				return fail("its checkpoint could not be loaded: " + err.Error())
			}
			if cp.InputSeq != r.cp.InputSeq || cp.PromptApplied != r.cp.PromptApplied || cp.ClaudeSessionID != r.cp.ClaudeSessionID {
				return fail("the stored checkpoint is not the last turn's")
			}
			if err := session.RestoreCheckpoint(lctx, q.w.cfg.Checkpoints, r.sb, q.job.Tenant, q.job.ID, cp); err != nil {
				return fail("its checkpoint could not be restored: " + err.Error())
			}
			resume = cp.ClaudeSessionID
		} else {
			// The first turn of a session that options.resume started:
			// that query's checkpoint again.
			res, err := restoreResume(lctx, q, r.sb, func(agent.Line) error { return nil })
			if res.done || err != nil {
				return fail("the session named by options.resume could not be restored again")
			}
			resume = res.sid
		}
	}
	_ = r.cur.Close(context.WithoutCancel(ctx)) // exited already; reaps it
	ns, err := r.start(ctx, resume, emit)
	if err != nil {
		return fail("the agent could not be started again: " + err.Error())
	}
	r.cur = ns
	r.base = r.turns
	return ns, ""
}

// closeAndCheckpoint ends the process (stdin closed, it exits) and stores
// the final checkpoint, complete now that the agent has flushed its files.
func (r *sessionRun) closeAndCheckpoint(ctx context.Context, s *session.Session) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	_ = s.Close(cctx)
	cancel()
	r.checkpoint(ctx, s)
}

// checkpoint stores the session's state after a turn. A failure is logged:
// the session goes on, and a later checkpoint catches up.
func (r *sessionRun) checkpoint(ctx context.Context, s *session.Session) {
	if r.cp.ClaudeSessionID == "" {
		return
	}
	r.cp.Turn = r.turns
	r.cp.At = time.Now().UTC()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if _, err := session.SaveMax(cctx, r.q.w.cfg.Checkpoints, r.sb, r.q.job.Tenant, r.q.job.ID, r.cp, r.q.w.cfg.Sessions.FilesLimit()); err != nil {
		r.cpFailures++
		r.cpErr = err
		r.log.Error().Err(err).Msg("storing the session checkpoint")
		return
	}
	r.cpFailures, r.cpErr = 0, nil
}

// followInputs starts an ordered consumer of the query's .ctl subject in
// FLEET_QUERIES and feeds ops (valid session ops only, in stream order).
func (r *sessionRun) followInputs(ctx context.Context, ops chan<- ctlEntry) (func(), error) {
	q := r.q
	w, job := q.w, q.job
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{w.names.QueryCtl(job.Tenant, job.ID)}, InactiveThreshold: jsconsumer.InactiveThreshold}
	if r.cp.InputSeq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.cp.InputSeq+1
	} else {
		t := r.cp.QueuedAt
		if t.IsZero() {
			t = q.queuedAt
		}
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	cons, err := w.js.OrderedConsumer(cctx, w.names.QueriesStream(), cfg)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		op, err := protocol.DecodeCtlOp(m.Headers().Get(protocol.HeaderContentType), m.Data())
		if err != nil {
			q.log.Warn().Err(err).Uint64("ctl_seq", md.Sequence.Stream).Msg("invalid .ctl message ignored")
			return
		}
		switch op.Op {
		case protocol.OpCancel, protocol.OpFence:
			return // handled by the run's own subscription
		}
		select {
		case ops <- ctlEntry{seq: md.Sequence.Stream, op: op}:
		case <-done:
		}
	})
	if err != nil {
		return nil, err
	}
	return func() {
		close(done)
		cc.Stop()
		jsconsumer.Release(w.js, w.names.QueriesStream(), cons)
	}, nil
}

// parked reports whether the session parked.
func (r *sessionRun) parked() bool { return r.isParked }

// finish applies what the session says to its last status: its turn and
// Claude session; when parked, the last input read; when terminal, an
// ended session succeeded whatever its last turn's is_error, a crash
// explains itself, and a refused options.resume has its own code.
func (r *sessionRun) finish(_ context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	ev = r.status(ev)
	if ev.State == protocol.StateParked {
		ev.CtlSeq = r.lastSeq
		return ev
	}
	if r.refused && ev.Error != nil {
		ev.Error.Code = protocol.CodeResumeNotFound
	}
	if r.ended {
		ev.State, ev.Error = protocol.StateSucceeded, nil
	}
	if r.crashNote != "" && ev.Error != nil {
		ev.Error.Message = r.crashNote
	}
	return ev
}

func stopCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}
