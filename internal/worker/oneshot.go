package worker

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// oneShot runs a job's agent once, to its result: options.resume restores
// the named checkpoint first, and afterwards the run's own session is
// checkpointed so a later job can resume it.
type oneShot struct {
	q   *query
	env map[string]string
	// refused: options.resume named nothing of the tenant.
	refused bool
}

// request is the agent's run of the job: the one place the one-shot
// agent's request (its process spec, built by the runner) is made.
func (o *oneShot) request(sb sandbox.Sandbox, job *protocol.Job) agent.Request {
	var timeout time.Duration
	if job.Options.TimeoutS != nil {
		timeout = time.Duration(*job.Options.TimeoutS) * time.Second
	}
	return agent.Request{Sandbox: sb, Job: job, Env: o.env, ProcID: "agent-" + strconv.Itoa(o.q.attempt), Timeout: timeout}
}

func (o *oneShot) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (out agent.Outcome, err error) {
	q := o.q
	ctx, emit, stop := o.watchStalls(ctx, sb, emit)
	defer stop()
	at := q.startAgent(ctx, o.env)
	emit = at.wrap(q, emit)
	defer func() { at.end(out, err) }()
	store := q.w.cfg.Checkpoints
	job := q.job
	if job.Options.Resume != "" && store != nil {
		r, err := restoreResume(ctx, q, sb, emit)
		o.refused = r.refused
		if r.done || err != nil {
			return r.out, err
		}
		j := *job
		j.Options.Resume = r.sid
		job = &j
	}
	out, err = o.runAgent(ctx, o.request(sb, job), emit)
	if err == nil && !out.HandedBack && out.SessionID != "" && store != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		_, serr := session.SaveMax(cctx, store, sb, q.job.Tenant, q.job.ID, session.Checkpoint{
			Job: q.job, JobSeq: q.jobSeq, QueuedAt: q.queuedAt, ClaudeSessionID: out.SessionID,
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

func (o *oneShot) parked() bool { return false }

// finish gives a refused options.resume its own code.
func (o *oneShot) finish(_ context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	if o.refused && ev.Error != nil {
		ev.Error.Code = protocol.CodeResumeNotFound
	}
	return ev
}

// watchStalls gives the run its stall watch (stall.go): a stall stops the
// run with cause agent.StallError, so that it ends failed, code stalled.
// stop ends the watch.
func (o *oneShot) watchStalls(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (context.Context, agent.EmitFunc, func()) {
	q := o.q
	d, err := stallTimeout(q.job, q.w.cfg.StallTimeout, q.w.cfg.StallTimeoutMax)
	if err != nil || d == 0 {
		return ctx, emit, func() {}
	}
	sctx, cancel := context.WithCancelCause(ctx)
	sw := newStallWatch(sctx, q, d, sb)
	sw.arm()
	go func() {
		select {
		case silence := <-sw.fired:
			q.w.metrics.stalls.WithLabelValues(q.job.Tenant).Inc()
			cancel(agent.StallError{Silence: silence})
		case <-sctx.Done():
		}
	}()
	return sctx, sw.wrap(emit), func() { cancel(nil) }
}
