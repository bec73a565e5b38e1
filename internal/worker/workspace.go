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

// workspaceMode wraps a run's mode with the job's workspace (docs/workspaces.md):
// the repository is checked out into the sandbox before the agent starts
// (and "running" announced with its start_sha), and the work is captured
// (commit, diff, bundle, push) after it ends, for the terminal status.
type workspaceMode struct {
	mode
	q *query
	// artifact and status are the capture's, for the terminal status.
	artifact *protocol.Artifact
	status   *protocol.WorkspaceStatus
}

func (m *workspaceMode) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (out agent.Outcome, err error) {
	if _, failed := sb.(failedSandbox); failed {
		// No sandbox: the inner mode ends the run through the runner's
		// spawn-failure path.
		return m.mode.run(ctx, sb, emit)
	}
	base, early, ok, cerr := m.checkout(ctx, sb, emit)
	if !ok {
		return early, cerr
	}
	defer func() {
		if !m.q.fenced.is() && !out.HandedBack && (err == nil || out.Result != nil) {
			m.capture(ctx, sb, base)
		}
	}()
	return m.mode.run(ctx, sb, emit)
}

// finish adds the capture to a terminal or parked status, publishing the
// artifact first, so a client that sees the status can read it. A parked
// session's capture (its bundle is what the continuation restores) is
// marked Checkpoint: `status` and `diff` show the work as of the last
// checkpoint while the session is parked, and say so.
func (m *workspaceMode) finish(ctx context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	ev = m.mode.finish(ctx, ev)
	if ev.State == protocol.StateParked {
		if m.artifact != nil {
			m.artifact.Checkpoint = true
		}
		if m.status != nil {
			m.status.Checkpoint = true
		}
	}
	ev.Workspace = m.status
	m.publishArtifact(ctx)
	return ev
}

// checkout checks the job's workspace out into sb before the agent starts
// and announces "running" with its start_sha. ok false means the run is
// over: out (a synthetic result, or a hand-back) or err (retry) say how.
func (m *workspaceMode) checkout(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (base workspace.Base, out agent.Outcome, ok bool, err error) {
	q := m.q
	job := q.job
	ws := q.w.cfg.Workspaces
	if ws == nil {
		out, err = syntheticEnd(emit, protocol.ReasonWorkspaceCheckout, "worker: "+errNoWorkspaces.Error())
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
		logRepoCache(q, base)
		q.status(protocol.StatusEvent{State: protocol.StateRunning, Workspace: &protocol.WorkspaceStatus{
			StartSHA: base.StartSHA, Cache: base.Cache, CacheCold: base.CacheCold}})
		return base, out, true, nil
	case errors.Is(context.Cause(ctx), agent.ErrHandback):
		return base, agent.Outcome{HandedBack: true}, false, nil
	case errors.Is(context.Cause(ctx), agent.ErrCancelled):
		out, err = syntheticEnd(emit, protocol.ReasonCancelled, "worker: the query was cancelled during the workspace checkout")
		return base, out, false, err
	case errors.Is(err, workspace.ErrCheckout):
		q.log.Warn().Err(err).Msg("workspace checkout failed; not retried")
		out, err = syntheticEnd(emit, protocol.ReasonWorkspaceCheckout, err.Error())
		return base, out, false, err
	default:
		return base, out, false, fmt.Errorf("workspace checkout: %w", err)
	}
}

// capture captures the work of a run that ended (not handed back) and
// keeps the artifact for the terminal status. The run's context may be
// cancelled (cancel, timeout): capture goes on without it.
func (m *workspaceMode) capture(ctx context.Context, sb sandbox.Sandbox, base workspace.Base) {
	q := m.q
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), captureTimeout)
	defer cancel()
	art, err := q.w.cfg.Workspaces.Capture(ctx, sb, base)
	if err != nil {
		q.log.Error().Err(err).Msg("capturing the workspace")
		m.status = &protocol.WorkspaceStatus{StartSHA: base.StartSHA, Branch: base.Branch, CaptureError: err.Error()}
		return
	}
	if art.PushError != "" {
		q.log.Warn().Str("push_error", art.PushError).Msg("pushing the work branch failed; the bundle is stored")
	}
	m.artifact = &art
	m.status = art.Summary()
}

// publishArtifact publishes the manifest on .artifact, before the terminal
// status, so a client that sees the status can read it.
func (m *workspaceMode) publishArtifact(ctx context.Context) {
	q := m.q
	if m.artifact == nil {
		return
	}
	b, err := protocol.JSON{}.Marshal(m.artifact)
	if err == nil {
		msg := nats.NewMsg(q.w.names.QueryArtifact(q.job.Tenant, q.job.ID))
		msg.Data = b
		msg.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		msg.Header.Set(protocol.HeaderAttempt, fmt.Sprint(q.attempt))
		pctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		_, err = q.w.js.PublishMsg(pctx, msg)
	}
	if err != nil {
		q.log.Error().Err(err).Msg("publishing the workspace artifact")
	}
}
