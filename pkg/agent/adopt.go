package agent

import (
	"context"
	"errors"
	"time"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Command is the agent program and its leading arguments (Config.Command).
func (r *Runner) Command() []string { return append([]string(nil), r.cfg.Command...) }

// Adopt runs req to its end like Run, with an agent process that was
// already started (a warm agent, docs/warm.md: spawned ahead in stream-json
// input mode, then given the job's prompt as its first message) instead
// of starting one from req. Its output is read from proc.Stdout; the run's
// outcome, timeout (from now), stops and synthetic result are Run's.
// req.Sandbox is the sandbox proc runs in.
func (r *Runner) Adopt(ctx context.Context, req Request, proc sandbox.Process, emit EmitFunc) (Outcome, error) {
	if req.Sandbox == nil || req.Job == nil || proc == nil {
		return Outcome{}, errors.New("agent: Adopt needs a Sandbox, a Job and a process")
	}
	log := r.cfg.Logger.With().Str("component", "agent").Str("query_id", req.Job.ID).Bool("warm", true).Logger()
	start := time.Now()
	runCtx := ctx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeoutCause(ctx, req.Timeout, ErrTimeout)
		defer cancel()
	}
	s := &supervisor{r: r, ctx: ctx, proc: proc, log: log}
	rr, wr := s.watch(runCtx, emit)
	return r.conclude(req, rr, wr, s.stopReason, start, emit, log)
}
