package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// checkoutTimeout bounds a workspace checkout; one that runs out is a
// transient failure (retried).
const checkoutTimeout = 30 * time.Minute

// captureTimeout bounds a workspace capture (commit, diff, bundle, store, push).
const captureTimeout = 10 * time.Minute

// errNoWorkspaces fails workspace jobs on a worker configured without them.
var errNoWorkspaces = errors.New("this worker has no workspace support configured")

// checkout checks the job's workspace out into sb before the agent starts
// and announces "running" with its start_sha. ok false means the run is
// over: out (a synthetic result, or a hand-back) or err (retry) say how.
func (q *query) checkout(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (base workspace.Base, out agent.Outcome, ok bool, err error) {
	job := q.job
	ws := q.w.cfg.Workspaces
	if ws == nil {
		out, err = q.syntheticEnd(emit, protocol.ReasonWorkspaceCheckout, "worker: "+errNoWorkspaces.Error())
		return base, out, false, err
	}
	cctx, cancel := context.WithTimeout(ctx, checkoutTimeout)
	base, err = ws.Checkout(cctx, sb, workspace.Spec{Tenant: job.Tenant, ID: job.ID, Workspace: *job.Workspace})
	cancel()
	if err == nil && job.Session != nil && job.Session.Continuation {
		// A parked session resumes: its workspace continues from the
		// bundle its last capture stored, not from a fresh checkout.
		rctx, cancel := context.WithTimeout(ctx, checkoutTimeout)
		var restored bool
		if base, restored, err = ws.Restore(rctx, sb, base); restored {
			q.log.Info().Msg("workspace restored from the parked session's last capture")
		}
		cancel()
	}
	switch {
	case err == nil:
		q.status(protocol.StatusEvent{State: protocol.StateRunning, Workspace: &protocol.WorkspaceStatus{StartSHA: base.StartSHA}})
		return base, out, true, nil
	case errors.Is(context.Cause(ctx), agent.ErrHandback):
		return base, agent.Outcome{HandedBack: true}, false, nil
	case errors.Is(context.Cause(ctx), agent.ErrCancelled):
		out, err = q.syntheticEnd(emit, protocol.ReasonCancelled, "worker: the query was cancelled during the workspace checkout")
		return base, out, false, err
	case errors.Is(err, workspace.ErrCheckout):
		q.log.Warn().Err(err).Msg("workspace checkout failed; not retried")
		out, err = q.syntheticEnd(emit, protocol.ReasonWorkspaceCheckout, err.Error())
		return base, out, false, err
	default:
		return base, out, false, fmt.Errorf("workspace checkout: %w", err)
	}
}

// capture captures the work of a run that ended (not handed back) and
// keeps the artifact for the terminal status. The run's context may be
// cancelled (cancel, timeout): capture goes on without it.
func (q *query) capture(ctx context.Context, sb sandbox.Sandbox, base workspace.Base) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), captureTimeout)
	defer cancel()
	art, err := q.w.cfg.Workspaces.Capture(ctx, sb, base)
	if err != nil {
		q.log.Error().Err(err).Msg("capturing the workspace")
		q.wsStatus = &protocol.WorkspaceStatus{StartSHA: base.StartSHA, Branch: base.Branch, CaptureError: err.Error()}
		return
	}
	if art.PushError != "" {
		q.log.Warn().Str("push_error", art.PushError).Msg("pushing the work branch failed; the bundle is stored")
	}
	q.artifact = &art
	q.wsStatus = art.Summary()
}

// publishArtifact publishes the manifest on .artifact, before the terminal
// status, so a client that sees the status can read it.
func (q *query) publishArtifact(ctx context.Context) {
	if q.artifact == nil {
		return
	}
	b, err := protocol.JSON{}.Marshal(q.artifact)
	if err == nil {
		m := nats.NewMsg(q.w.names.QueryArtifact(q.job.Tenant, q.job.ID))
		m.Data = b
		m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		m.Header.Set(protocol.HeaderAttempt, fmt.Sprint(q.attempt))
		pctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		_, err = q.w.js.PublishMsg(pctx, m)
	}
	if err != nil {
		q.log.Error().Err(err).Msg("publishing the workspace artifact")
	}
}

// syntheticEnd ends a run that never started its agent with one synthetic
// result line.
func (q *query) syntheticEnd(emit agent.EmitFunc, reason, message string) (agent.Outcome, error) {
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
