package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/internal/relay"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// Session jobs (SPEC 9). The query's .ctl subject, as captured by
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
	sb  sandbox.Sandbox
	log zerolog.Logger

	cp       session.Checkpoint // what the next checkpoint says
	restored bool
	turns    int
	base     int    // turns of earlier processes (a restored session)
	lastSeq  uint64 // last .ctl sequence read
	ended    bool   // by an "end" op
	parked   bool

	// The running process.
	cur *session.Session
	// Starts a process.
	start func(ctx context.Context, resume string) (*session.Session, error)
	// The Claude session options.resume restored.
	resumedFrom string
	// Crash-resumes so far.
	crashes int
	// The input whose turn crashed last.
	crashedIn *queued
	// Why the session failed after crashes.
	crashNote string
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

// runSession runs a session job in sb; see the comment at the top.
func (q *query) runSession(ctx context.Context, sb sandbox.Sandbox, env map[string]string, emit agent.EmitFunc) (agent.Outcome, error) {
	w, job := q.w, q.job
	r := &sessionRun{q: q, sb: sb, log: q.log.With().Str("session", "true").Logger()}
	q.sess = r
	r.cp = session.Checkpoint{Job: job, JobSeq: q.jobSeq(), QueuedAt: q.queuedAt()}

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
	case err == nil && (job.Session.Continuation || (q.attempt > 1 && cp.JobSeq == q.jobSeq())):
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
		sid, out, done, err := q.restoreResume(ctx, sb, emit)
		if done || err != nil {
			return out, err
		}
		resume = sid
		r.resumedFrom = sid
	}

	r.log.Debug().Bool("restored", r.restored).Uint64("input_seq", r.cp.InputSeq).Time("queued_at", r.cp.QueuedAt).Msg("session starting")
	// The input log.
	ops := make(chan ctlEntry, 256)
	stopLog, err := q.followInputs(ctx, r, ops)
	if err != nil {
		return agent.Outcome{}, fmt.Errorf("following the session's input log: %w", err)
	}
	defer stopLog()

	reqs := make(chan session.Request, 16)
	procs := 0
	r.start = func(ctx context.Context, resume string) (*session.Session, error) {
		procs++
		id := fmt.Sprintf("session-%d", q.attempt)
		if procs > 1 {
			id = fmt.Sprintf("session-%d-r%d", q.attempt, procs-1)
		}
		return session.Start(ctx, w.cfg.Sessions, session.Spec{
			Sandbox: sb, Job: r.cp.Job, Env: env, ProcID: id, Resume: resume,
			OnRequest: func(req session.Request) {
				select {
				case reqs <- req:
				case <-ctx.Done():
				}
			},
		}, emit)
	}
	s, err := r.start(ctx, resume)
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
	return r.loop(ctx, s, ops, reqs, emit)
}

type queued struct {
	seq  uint64 // 0 for the job's prompt
	text string
	uuid string
}

// loop is the session's single control goroutine.
func (r *sessionRun) loop(ctx context.Context, s *session.Session, ops <-chan ctlEntry, reqs <-chan session.Request, emit agent.EmitFunc) (agent.Outcome, error) {
	q := r.q
	var queue []queued
	if !r.cp.PromptApplied {
		queue = append(queue, queued{text: r.cp.Job.Prompt})
	}
	type turnResult struct {
		in  queued
		out agent.Outcome
		err error
	}
	var (
		running   *queued
		turnDone  = make(chan turnResult, 1)
		last      agent.Outcome
		endAsked  bool
		idle      = time.NewTimer(time.Hour)
		idleAfter = time.Duration(r.cp.Job.Session.IdleTimeout()) * time.Second
	)
	if d := q.w.cfg.Test.SessionIdle; d > 0 {
		idleAfter = d
	}
	idle.Stop()
	defer idle.Stop()
	idleArmed := false
	// The worker stopping: an idle session parks at once (after its turn
	// when one runs) instead of holding the shutdown for its grace period.
	stopping := q.w.stopCh
	parkNow := false
	for {
		if running == nil && len(queue) == 0 && parkNow && !endAsked {
			r.parked = true
			r.closeAndCheckpoint(ctx, s)
			return last, nil
		}
		if running == nil && len(queue) > 0 {
			in := queue[0]
			queue = queue[1:]
			running = &in
			idle.Stop()
			idleArmed = false
			q.status(r.status(protocol.StatusEvent{State: protocol.StateRunning}))
			go func() {
				// options.timeout_s bounds each turn of a session (its
				// approvals included): one that runs longer is stopped
				// and ends the session as failed, code timeout, as it
				// ends a one-shot run. Idle time between turns is bounded
				// by the idle timeout and --session-ttl instead.
				tctx := ctx
				if t := q.job.Options.TimeoutS; t != nil && *t > 0 {
					var cancel context.CancelFunc
					tctx, cancel = context.WithTimeoutCause(ctx, time.Duration(*t)*time.Second, agent.ErrTimeout)
					defer cancel()
				}
				out, err := s.Turn(tctx, session.Input{Text: in.text, UUID: in.uuid})
				turnDone <- turnResult{in, out, err}
			}()
		}
		if running == nil && endAsked {
			r.ended = true
			r.closeAndCheckpoint(ctx, s)
			if last.Result == nil {
				// A continuation that only ends the session ran no turn:
				// the session's last result line is already in the
				// stream (the turn before it parked).
				last = agent.Outcome{Result: &protocol.Result{
					Subtype: "success", NumTurns: r.turns, SessionID: r.cp.ClaudeSessionID}}
			}
			return last, nil
		}
		if running == nil && !idleArmed {
			idle.Reset(idleAfter)
			idleArmed = true
		}
		select {
		case e := <-ops:
			r.log.Debug().Str("op", e.op.Op).Uint64("ctl_seq", e.seq).Msg("session op")
			r.lastSeq = e.seq
			switch e.op.Op {
			case protocol.OpInput:
				if endAsked {
					r.log.Warn().Uint64("ctl_seq", e.seq).Msg("input after end; ignored")
					continue
				}
				queue = append(queue, queued{seq: e.seq, text: e.op.Text, uuid: e.op.UUID})
			case protocol.OpInterrupt:
				if running != nil {
					if err := s.Interrupt(); err != nil {
						r.log.Warn().Err(err).Msg("interrupt")
					}
				}
			case protocol.OpApprove:
				if err := s.Respond(e.op.RequestID, *e.op.Allow, e.op.Message, e.op.UpdatedInput); err != nil {
					r.log.Warn().Err(err).Str("request_id", e.op.RequestID).Msg("approve")
					continue
				}
				if running != nil && len(s.Pending()) == 0 {
					q.status(r.status(protocol.StatusEvent{State: protocol.StateRunning}))
				}
			case protocol.OpEnd:
				endAsked = true
			}
		case req := <-reqs:
			ev := r.status(protocol.StatusEvent{State: protocol.StateAwaitingApproval})
			ev.RequestID, ev.ToolName = req.RequestID, req.ToolName
			q.status(ev)
		case res := <-turnDone:
			running = nil
			last = res.out
			if res.err != nil || res.out.HandedBack {
				return res.out, res.err
			}
			r.turns = r.base + s.Turns()
			if sid := s.SessionID(); sid != "" {
				r.cp.ClaudeSessionID = sid
			}
			if res.out.Synthetic {
				// The process is gone. Cancel, a deadline or a hand-back end
				// the session here; a crash resumes it (see the top).
				if ctx.Err() != nil || res.out.Reason != protocol.ReasonProcessExit {
					return res.out, nil
				}
				ns, ok := r.recoverCrash(ctx, res.in, res.out)
				if !ok {
					return res.out, nil
				}
				s = ns
				queue = append([]queued{res.in}, queue...)
				continue
			}
			if r.crashedIn != nil && *r.crashedIn == res.in {
				r.crashedIn = nil // it ran this time
			}
			if res.in.seq == 0 {
				r.cp.PromptApplied = true
			} else {
				r.cp.InputSeq = res.in.seq
			}
			r.checkpoint(ctx, s)
			if len(queue) == 0 && !endAsked {
				q.status(r.idleStatus())
			}
		case <-stopping:
			stopping = nil
			parkNow = true
		case <-idle.C:
			idleArmed = false
			if len(queue) > 0 || running != nil {
				continue
			}
			if r.cpFailures > 0 {
				// Parking would lose what the last checkpoint lacks: try
				// again, and stay (holding the slot, saying why) until one
				// is stored.
				r.checkpoint(ctx, s)
				if r.cpFailures > 0 {
					q.status(r.idleStatus())
					continue
				}
			}
			// Park: stdin closed, the agent exits, the checkpoint holds
			// everything; the job is acked by the caller.
			r.parked = true
			r.closeAndCheckpoint(ctx, s)
			return last, nil
		case <-ctx.Done():
			if running != nil {
				res := <-turnDone // Turn stops the process and writes the result
				return res.out, res.err
			}
			cause := context.Cause(ctx)
			if errors.Is(cause, agent.ErrHandback) {
				return agent.Outcome{HandedBack: true}, nil
			}
			reason, msg := agent.ReasonFor(cause)
			return agent.EmitSynthetic(emit, agent.Outcome{SessionID: s.SessionID()}, protocol.SyntheticInput{
				Reason: reason, Message: msg, SessionID: s.SessionID(), NumTurns: r.turns,
			})
		}
	}
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
func (r *sessionRun) recoverCrash(ctx context.Context, in queued, out agent.Outcome) (*session.Session, bool) {
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
				return giveUp("its checkpoint could not be loaded: " + err.Error())
			}
			if cp.InputSeq != r.cp.InputSeq || cp.PromptApplied != r.cp.PromptApplied || cp.ClaudeSessionID != r.cp.ClaudeSessionID {
				return giveUp("the stored checkpoint is not the last turn's")
			}
			if err := session.RestoreCheckpoint(lctx, q.w.cfg.Checkpoints, r.sb, q.job.Tenant, q.job.ID, cp); err != nil {
				return giveUp("its checkpoint could not be restored: " + err.Error())
			}
			resume = cp.ClaudeSessionID
		} else {
			// The first turn of a session that options.resume started:
			// that query's checkpoint again.
			sid, _, done, err := q.restoreResume(lctx, r.sb, func(agent.Line) error { return nil })
			if done || err != nil {
				return giveUp("the session named by options.resume could not be restored again")
			}
			resume = sid
		}
	}
	_ = r.cur.Close(context.WithoutCancel(ctx)) // exited already; reaps it
	ns, err := r.start(ctx, resume)
	if err != nil {
		return giveUp("the agent could not be started again: " + err.Error())
	}
	r.cur = ns
	r.base = r.turns
	msg := fmt.Sprintf("the agent crashed during the turn of %s (%s); resumed from the last checkpoint (resume %d of %d), the input runs again",
		what, exit, r.crashes, maxCrashResumes)
	r.log.Warn().Int("crashes", r.crashes).Uint64("ctl_seq", in.seq).Msg("agent crashed; session resumed")
	ev := r.status(protocol.StatusEvent{State: protocol.StateRunning})
	ev.Error = &protocol.ErrorInfo{Code: protocol.CodeProcessExit, Message: msg}
	q.status(ev)
	return ns, true
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
func (q *query) followInputs(ctx context.Context, r *sessionRun, ops chan<- ctlEntry) (func(), error) {
	w, job := q.w, q.job
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{w.names.QueryCtl(job.Tenant, job.ID)}, InactiveThreshold: jsconsumer.InactiveThreshold}
	if r.cp.InputSeq > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.cp.InputSeq+1
	} else {
		t := r.cp.QueuedAt
		if t.IsZero() {
			t = q.queuedAt()
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

// restoreResume handles options.resume: the named earlier query (or Claude
// session id) of the same tenant must have a checkpoint, which is restored
// into sb. Otherwise the run ends at once with a synthetic result (done).
func (q *query) restoreResume(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (sid string, out agent.Outcome, done bool, err error) {
	store := q.w.cfg.Checkpoints
	job := q.job
	if store == nil {
		out, err = agent.EmitSynthetic(emit, agent.Outcome{}, protocol.SyntheticInput{
			Reason: protocol.ReasonSpawnFailed, Message: "worker: options.resume needs session checkpoints, and this worker keeps none"})
		return "", out, true, err
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cp, from, err := session.Find(fctx, store, job.Tenant, job.Options.Resume)
	if err == nil {
		err = session.RestoreCheckpoint(fctx, store, sb, job.Tenant, from, cp)
	}
	if errors.Is(err, session.ErrNoCheckpoint) {
		q.resumeRefused = true
		out, err = agent.EmitSynthetic(emit, agent.Outcome{}, protocol.SyntheticInput{
			Reason: protocol.ReasonSpawnFailed,
			Message: fmt.Sprintf("worker: options.resume %q names no earlier query or session of tenant %s with a checkpoint",
				job.Options.Resume, job.Tenant)})
		return "", out, true, err
	}
	if err != nil {
		return "", agent.Outcome{}, false, fmt.Errorf("restoring options.resume: %w", err)
	}
	q.log.Info().Str("from_query", from).Msg("restored the session named by options.resume")
	return cp.ClaudeSessionID, agent.Outcome{}, false, nil
}

// runOneShot runs a one-shot job: options.resume restores the named
// checkpoint first, and afterwards the run's own session is checkpointed so
// a later job can resume it.
func (q *query) runOneShot(ctx context.Context, sb sandbox.Sandbox, req agent.Request, emit agent.EmitFunc) (agent.Outcome, error) {
	store := q.w.cfg.Checkpoints
	if q.job.Options.Resume != "" && store != nil {
		sid, out, done, err := q.restoreResume(ctx, sb, emit)
		if done || err != nil {
			return out, err
		}
		j := *q.job
		j.Options.Resume = sid
		req.Job = &j
	}
	out, err := q.w.cfg.Runner.Run(ctx, req, emit)
	if err == nil && !out.HandedBack && out.SessionID != "" && store != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		_, serr := session.SaveMax(cctx, store, sb, q.job.Tenant, q.job.ID, session.Checkpoint{
			Job: q.job, JobSeq: q.jobSeq(), QueuedAt: q.queuedAt(), ClaudeSessionID: out.SessionID,
			PromptApplied: true, Turn: 1,
		}, q.w.cfg.Sessions.FilesLimit())
		cancel()
		switch {
		case errors.Is(serr, session.ErrNoSessionFile):
			q.log.Debug().Msg("the agent left no session file to checkpoint")
		case serr != nil:
			q.log.Warn().Err(serr).Msg("checkpointing the run's session")
		}
	}
	return out, err
}

// adjustTerminal applies what sessions and options.resume say to a
// terminal status: an ended session succeeded whatever its last turn's
// is_error; a refused resume has its own code.
func (q *query) adjustTerminal(ev protocol.StatusEvent) protocol.StatusEvent {
	if q.resumeRefused && ev.Error != nil {
		ev.Error.Code = protocol.CodeResumeNotFound
	}
	if q.sess != nil {
		ev = q.sess.status(ev)
		if q.sess.ended {
			ev.State, ev.Error = protocol.StateSucceeded, nil
		}
		if q.sess.crashNote != "" && ev.Error != nil {
			ev.Error.Message = q.sess.crashNote
		}
	}
	return ev
}

// park ends this job of a parked session: every line in the stream, the
// journal persisted (so a continuation may open it again at once), the
// parked status, then the ack. No terminal status: the query goes on.
func (q *query) park(rel *relay.Relay, jl journalCloser) {
	w := q.w
	fctx, cancel := context.WithTimeout(context.Background(), w.cfg.FlushTimeout)
	defer cancel()
	if !q.flushed(fctx, rel, jl, "parking") {
		return
	}
	if err := jl.Close(false); err != nil {
		q.log.Error().Err(err).Msg("closing the journal")
	}
	if err := w.cfg.Journal.WaitPersisted(fctx, q.job.Tenant, q.job.ID); err != nil {
		q.log.Warn().Err(err).Msg("the parked session's journal is not persisted yet")
	}
	ev := q.sess.status(protocol.StatusEvent{State: protocol.StateParked})
	ev.CtlSeq = q.sess.lastSeq
	ev.Result = &protocol.ResultSummary{LastSeq: rel.Seq()}
	switch v, err := q.fw.Publish(fctx, q.event(ev)); {
	case err != nil:
		// The checkpoint is stored: the next attempt restores it.
		q.retry(fmt.Errorf("publishing the parked status: %w", err), "")
		return
	case v != fence.Proceed:
		q.stepAside(v, "before the parked status")
		return
	}
	q.ack(context.Background())
	w.metrics.jobs.WithLabelValues(string(protocol.StateParked)).Inc()
	q.log.Info().Int("turn", q.sess.turns).Msg("session parked")
}

func stopCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}
