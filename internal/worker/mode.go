package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// mode is how a run goes once its attempt owns the query: a one-shot run
// (oneshot.go) or a session (session.go), a workspace around either
// (workspace.go). The attempt (query) claims, relays, journals and
// settles; the mode runs the agent.
type mode interface {
	// run runs the job's agent in sb until this job of the query ends,
	// writing every line through emit.
	run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (agent.Outcome, error)
	// parked reports whether the run ended by parking (a session).
	parked() bool
	// finish fills the mode's part of the run's last status, terminal or
	// parked, and publishes what must precede it (a workspace's artifact).
	finish(ctx context.Context, ev protocol.StatusEvent) protocol.StatusEvent
}

// hooked calls the test hooks (Config.Test) around a run's agent.
type hooked struct {
	mode
	q *query
}

func (h hooked) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (agent.Outcome, error) {
	t, job := h.q.w.cfg.Test, h.q.job
	if t.RunStarted != nil {
		t.RunStarted(job.Tenant, job.ID, h.q.attempt)
	}
	if t.RunEnded != nil {
		defer t.RunEnded(job.Tenant, job.ID, h.q.attempt)
	}
	return h.mode.run(ctx, sb, emit)
}

// syntheticEnd ends a run that never started its agent with one synthetic
// result line.
func syntheticEnd(emit agent.EmitFunc, reason, message string) (agent.Outcome, error) {
	line := protocol.SyntheticResult(protocol.SyntheticInput{Reason: reason, Message: message})
	msg := protocol.ParseMessage(line)
	res, err := msg.AsResult()
	if err != nil {
		return agent.Outcome{}, err
	}
	if err := emit(agent.Line{Raw: line, Msg: msg, Synthetic: true}); err != nil {
		return agent.Outcome{}, err
	}
	return agent.Outcome{Result: res, Synthetic: true, Reason: reason, Lines: 1}, nil
}

// resumed is what options.resume restored.
type resumed struct {
	// sid is the Claude session to resume.
	sid string
	// done: the run is over (out), as options.resume could not be met.
	done bool
	out  agent.Outcome
	// refused: options.resume named nothing of the tenant (its own code,
	// resume_not_found, on the terminal status).
	refused bool
}

// restoreResume handles options.resume: the named earlier query (or Claude
// session id) of the same tenant must have a checkpoint, which is restored
// into sb. Otherwise the run ends at once with a synthetic result (done).
func restoreResume(ctx context.Context, q *query, sb sandbox.Sandbox, emit agent.EmitFunc) (resumed, error) {
	store := q.w.cfg.Checkpoints
	job := q.job
	if store == nil {
		out, err := agent.EmitSynthetic(emit, agent.Outcome{}, protocol.SyntheticInput{
			Reason: protocol.ReasonSpawnFailed, Message: "worker: options.resume needs session checkpoints, and this worker keeps none"})
		return resumed{done: true, out: out}, err
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cp, from, err := session.Find(fctx, store, job.Tenant, job.Options.Resume)
	if err == nil {
		err = session.RestoreCheckpoint(fctx, store, sb, job.Tenant, from, cp)
	}
	if errors.Is(err, session.ErrNoCheckpoint) {
		out, err := agent.EmitSynthetic(emit, agent.Outcome{}, protocol.SyntheticInput{
			Reason: protocol.ReasonSpawnFailed,
			Message: fmt.Sprintf("worker: options.resume %q names no earlier query or session of tenant %s with a checkpoint",
				job.Options.Resume, job.Tenant)})
		return resumed{done: true, out: out, refused: true}, err
	}
	if err != nil {
		return resumed{}, fmt.Errorf("restoring options.resume: %w", err)
	}
	q.log.Info().Str("from_query", from).Msg("restored the session named by options.resume")
	return resumed{sid: cp.ClaudeSessionID}, nil
}
