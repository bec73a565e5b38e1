package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// A stalled session turn (stall.go) is interrupted, as a user's interrupt
// would: the agent that answers ends the turn with its own result and the
// session goes on. One that does not answer within --stall-grace is
// stopped (the turn ends with a synthetic result, reason stalled), and a
// new process resumes the session from its last checkpoint, waiting for
// the next input; the stalled input is not run again. Each step is a
// status with reason "stalled".

// stalled acts on a stall of the running turn: a status saying so, an
// interrupt, and the grace for the agent to answer it.
func (l *sessionLoop) stalled(silence time.Duration) {
	r := l.r
	if l.running == nil {
		return
	}
	q := r.q
	q.w.metrics.stalls.WithLabelValues(q.job.Tenant).Inc()
	grace := q.w.cfg.StallGrace
	ev := r.status(protocol.StatusEvent{State: protocol.StateRunning, Reason: protocol.ReasonStalled})
	ev.Error = &protocol.ErrorInfo{Code: protocol.CodeStalled, Message: fmt.Sprintf(
		"the agent wrote nothing for %.1f seconds during the turn; the turn is interrupted, and the agent is stopped if it does not answer within %s",
		silence.Seconds(), grace)}
	q.status(ev)
	if err := l.s.Interrupt(); err != nil {
		r.log.Warn().Err(err).Msg("interrupting the stalled turn")
	}
	l.silence = silence
	l.stopGrace()
	l.grace = time.NewTimer(grace)
	l.graceC = l.grace.C
}

// stopGrace stops a stalled turn's grace timer.
func (l *sessionLoop) stopGrace() {
	if l.grace != nil {
		l.grace.Stop()
	}
	l.grace, l.graceC = nil, nil
}

// recoverStall resumes a session whose stalled turn's agent was stopped:
// a new process resumes the last checkpoint and waits for the next input;
// the stalled input counts as taken (it is not run again). ok is false
// when the session cannot be resumed (crashNote says why).
func (r *sessionRun) recoverStall(ctx context.Context, in queued, emit agent.EmitFunc) (*session.Session, bool) {
	q := r.q
	what := "the job's prompt"
	if in.seq > 0 {
		what = fmt.Sprintf("input %d (.ctl sequence)", in.seq)
	}
	ns, why := r.restart(ctx, emit)
	if ns == nil {
		r.crashNote = fmt.Sprintf("the agent stalled during the turn of %s and did not answer its interrupt, so it was stopped; %s", what, why)
		r.log.Warn().Str("why", why).Msg("session not resumed after a stall")
		return nil, false
	}
	if in.seq == 0 {
		r.cp.PromptApplied = true
	} else {
		r.cp.InputSeq = in.seq
	}
	msg := fmt.Sprintf("the agent stalled during the turn of %s and did not answer its interrupt within %s, so it was stopped; the session resumed from its last checkpoint and waits for the next input",
		what, q.w.cfg.StallGrace)
	r.log.Warn().Uint64("ctl_seq", in.seq).Msg("stalled agent stopped; session resumed")
	ev := r.status(protocol.StatusEvent{State: protocol.StateIdle, Reason: protocol.ReasonStalled})
	ev.Error = &protocol.ErrorInfo{Code: protocol.CodeStalled, Message: msg}
	q.status(ev)
	return ns, true
}
