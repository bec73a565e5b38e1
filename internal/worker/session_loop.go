package worker

import (
	"context"
	"errors"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
)

type queued struct {
	seq  uint64 // 0 for the job's prompt
	text string
	uuid string
}

type turnResult struct {
	in  queued
	out agent.Outcome
	err error
}

// sessionLoop is the state of a session's single control goroutine
// (sessionRun.loop): the inputs queued, the turn running, and why the
// session would end.
type sessionLoop struct {
	r    *sessionRun
	s    *session.Session
	emit agent.EmitFunc

	queue    []queued
	running  *queued
	turnDone chan turnResult
	last     agent.Outcome
	endAsked bool

	idle      *time.Timer
	idleAfter time.Duration
	idleArmed bool
	// parkNow: the worker is stopping; an idle session parks at once
	// (after its turn when one runs) instead of holding the shutdown for
	// its grace period.
	parkNow bool

	// The running turn's cancel, and a stalled turn's grace (stall.go):
	// graceC fires when the interrupted turn did not answer in time.
	turnCancel context.CancelCauseFunc
	grace      *time.Timer
	graceC     <-chan time.Time
	silence    time.Duration
}

// loop is the session's single control goroutine.
func (r *sessionRun) loop(ctx context.Context, s *session.Session, ops <-chan ctlEntry, emit agent.EmitFunc) (agent.Outcome, error) {
	l := &sessionLoop{r: r, s: s, emit: emit, turnDone: make(chan turnResult, 1),
		idle: time.NewTimer(time.Hour), idleAfter: time.Duration(r.cp.Job.Session.IdleTimeout()) * time.Second}
	if !r.cp.PromptApplied {
		l.queue = append(l.queue, queued{text: r.cp.Job.Prompt})
	}
	if d := r.q.w.cfg.Test.SessionIdle; d > 0 {
		l.idleAfter = d
	}
	l.idle.Stop()
	defer l.idle.Stop()
	defer l.stopGrace()
	stopping := r.q.w.stopCh
	var stalls <-chan time.Duration
	if r.stall != nil {
		stalls = r.stall.fired
	}
	for {
		if done := l.next(ctx); done {
			return l.last, nil
		}
		select {
		case e := <-ops:
			l.op(e)
		case req := <-r.reqs:
			ev := r.status(protocol.StatusEvent{State: protocol.StateAwaitingApproval})
			ev.RequestID, ev.ToolName = req.RequestID, req.ToolName
			r.q.status(ev)
		case res := <-l.turnDone:
			if done := l.turnEnded(ctx, res); done {
				return res.out, res.err
			}
		case <-stopping:
			stopping = nil
			l.parkNow = true
		case silence := <-stalls:
			l.stalled(silence)
		case <-l.graceC:
			l.graceC = nil
			if l.running != nil {
				l.turnCancel(agent.StallError{Silence: l.silence + r.q.w.cfg.StallGrace})
			}
		case <-l.idle.C:
			if done := l.idleFired(ctx); done {
				return l.last, nil
			}
		case <-ctx.Done():
			return l.stopped(ctx)
		}
	}
}

// next acts on the state between events: it parks (the worker stopping)
// or ends (an "end" op) a session with no turn running, starts the next
// queued turn, or arms the idle timer. done means the session is over,
// with l.last its outcome.
func (l *sessionLoop) next(ctx context.Context) (done bool) {
	r := l.r
	if l.running == nil && len(l.queue) == 0 && l.parkNow && !l.endAsked {
		r.isParked = true
		r.closeAndCheckpoint(ctx, l.s)
		return true
	}
	if l.running == nil && len(l.queue) > 0 {
		l.startTurn(ctx)
	}
	if l.running == nil && l.endAsked {
		r.ended = true
		r.closeAndCheckpoint(ctx, l.s)
		if l.last.Result == nil {
			// A continuation that only ends the session ran no turn:
			// the session's last result line is already in the
			// stream (the turn before it parked).
			l.last = agent.Outcome{Result: &protocol.Result{
				Subtype: "success", NumTurns: r.turns, SessionID: r.cp.ClaudeSessionID}}
		}
		return true
	}
	if l.running == nil && !l.idleArmed {
		l.idle.Reset(l.idleAfter)
		l.idleArmed = true
	}
	return false
}

// startTurn writes the first queued input to the agent, its turn running
// in the background until turnDone.
func (l *sessionLoop) startTurn(ctx context.Context) {
	r, s := l.r, l.s
	in := l.queue[0]
	l.queue = l.queue[1:]
	l.running = &in
	l.idle.Stop()
	l.idleArmed = false
	if !r.q.running.Load() {
		// Else the claim's, the checkout's or a crash resume's "running"
		// announced this turn already: one "running" per turn start.
		r.q.status(r.status(protocol.StatusEvent{State: protocol.StateRunning}))
	}
	r.stall.arm()
	tctx, tcancel := context.WithCancelCause(ctx)
	l.turnCancel = tcancel
	go func() {
		defer tcancel(nil)
		// options.timeout_s bounds each turn of a session (its
		// approvals included): one that runs longer is stopped and
		// ends the session as failed, code timeout, as it ends a
		// one-shot run. Idle time between turns is bounded by the idle
		// timeout and --session-ttl instead.
		if t := r.q.job.Options.TimeoutS; t != nil && *t > 0 {
			var cancel context.CancelFunc
			tctx, cancel = context.WithTimeoutCause(tctx, time.Duration(*t)*time.Second, agent.ErrTimeout)
			defer cancel()
		}
		out, err := s.Turn(tctx, session.Input{Text: in.text, UUID: in.uuid})
		l.turnDone <- turnResult{in, out, err}
	}()
}

// op acts on one op of the input log.
func (l *sessionLoop) op(e ctlEntry) {
	r, s := l.r, l.s
	r.log.Debug().Str("op", e.op.Op).Uint64("ctl_seq", e.seq).Msg("session op")
	r.lastSeq = e.seq
	switch e.op.Op {
	case protocol.OpInput:
		if l.endAsked {
			r.log.Warn().Uint64("ctl_seq", e.seq).Msg("input after end; ignored")
			return
		}
		l.queue = append(l.queue, queued{seq: e.seq, text: e.op.Text, uuid: e.op.UUID})
	case protocol.OpInterrupt:
		if l.running != nil {
			if err := s.Interrupt(); err != nil {
				r.log.Warn().Err(err).Msg("interrupt")
			}
		}
	case protocol.OpApprove:
		if err := s.Respond(e.op.RequestID, *e.op.Allow, e.op.Message, e.op.UpdatedInput); err != nil {
			r.log.Warn().Err(err).Str("request_id", e.op.RequestID).Msg("approve")
			return
		}
		r.stall.answered(e.op.RequestID)
		if l.running != nil && len(s.Pending()) == 0 {
			r.q.status(r.status(protocol.StatusEvent{State: protocol.StateRunning}))
		}
	case protocol.OpEnd:
		l.endAsked = true
	}
}

// turnEnded takes a turn's end: a checkpoint after a completed turn, a
// resume after a crash. done means the session is over, with res its
// outcome.
func (l *sessionLoop) turnEnded(ctx context.Context, res turnResult) (done bool) {
	r, s := l.r, l.s
	l.running = nil
	r.stall.disarm()
	l.stopGrace()
	// The last "running" announced the turn that ended: the next one
	// (queued behind it, with no idle between) announces itself.
	r.q.running.Store(false)
	l.last = res.out
	if res.err != nil || res.out.HandedBack {
		return true
	}
	r.turns = r.base + s.Turns()
	if sid := s.SessionID(); sid != "" {
		r.cp.ClaudeSessionID = sid
	}
	if res.out.Synthetic && res.out.Reason == protocol.ReasonStalled && ctx.Err() == nil {
		ns, ok := r.recoverStall(ctx, res.in, l.emit)
		if !ok {
			return true
		}
		l.s = ns
		return false
	}
	if res.out.Synthetic {
		// The process is gone. Cancel, a deadline or a hand-back end
		// the session here; a crash resumes it (see the top).
		if ctx.Err() != nil || res.out.Reason != protocol.ReasonProcessExit {
			return true
		}
		ns, ok := r.recoverCrash(ctx, res.in, res.out, l.emit)
		if !ok {
			return true
		}
		l.s = ns
		l.queue = append([]queued{res.in}, l.queue...)
		return false
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
	if len(l.queue) == 0 && !l.endAsked {
		r.q.status(r.idleStatus())
	}
	return false
}

// idleFired parks a session idle for its idle timeout, unless its last
// checkpoint could not be stored. done means it parked.
func (l *sessionLoop) idleFired(ctx context.Context) (done bool) {
	r := l.r
	l.idleArmed = false
	if len(l.queue) > 0 || l.running != nil {
		return false
	}
	if r.cpFailures > 0 {
		// Parking would lose what the last checkpoint lacks: try
		// again, and stay (holding the slot, saying why) until one is
		// stored.
		r.checkpoint(ctx, l.s)
		if r.cpFailures > 0 {
			r.q.status(r.idleStatus())
			return false
		}
	}
	// Park: stdin closed, the agent exits, the checkpoint holds
	// everything; the job is acked by the caller.
	r.isParked = true
	r.closeAndCheckpoint(ctx, l.s)
	return true
}

// stopped ends a session whose run was stopped (cancel, hand-back, the
// worker's deadline).
func (l *sessionLoop) stopped(ctx context.Context) (agent.Outcome, error) {
	r, s := l.r, l.s
	if l.running != nil {
		res := <-l.turnDone // Turn stops the process and writes the result
		return res.out, res.err
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, agent.ErrHandback) {
		return agent.Outcome{HandedBack: true}, nil
	}
	reason, msg := agent.ReasonFor(cause)
	return agent.EmitSynthetic(l.emit, agent.Outcome{SessionID: s.SessionID()}, protocol.SyntheticInput{
		Reason: reason, Message: msg, SessionID: s.SessionID(), NumTurns: r.turns,
	})
}
