package dispatcher

// The API's answers: submit, cancel, status, list and the session ops,
// each taking a request already decoded and validated (decode.go). The
// endpoints of the micro service "agentfleet" (micro.go) decode a request
// and call one of these; another service that serves the same requests (a
// tenant-scoped one, say) decodes its own way and calls the same methods.

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/internal/schedule"
	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// NewID returns a fresh query id.
func NewID() string { return "q" + nuid.Next() }

// api answers the dispatcher's requests.
type api struct {
	queryDeps
	index    *statusIndex
	queued   *queuedCancel
	sessions *sessions
	dead     *deadLetters

	scheduleStore *schedule.Store
	triggers      *trigger.Store
	githubRules   *github.Store
}

// submit queues job (valid, with its id) on <prefix>.jobs.<tenant>.
func (h *api) submit(ctx context.Context, job *protocol.Job) protocol.SubmitReply {
	body, err := json.Marshal(job)
	if err != nil {
		return protocol.SubmitReply{Error: apiError(protocol.CodeInternal, err.Error())}
	}
	n := h.names
	jm := nats.NewMsg(n.JobSubject(job.Tenant))
	jm.Data = body
	jm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	jm.Header.Set(protocol.HeaderMsgID, protocol.JobMsgID(job.Tenant, job.ID))
	traceID, endSpan := h.traceJob(ctx, job, jm.Header)
	ack, err := h.js.PublishMsg(ctx, jm)
	endSpan(err)
	if err != nil {
		return protocol.SubmitReply{Error: apiError(protocol.CodeInternal, "publishing the job: "+err.Error())}
	}
	if !ack.Duplicate {
		// After the job, so it carries the submission's JobSeq (a worker's
		// "running" may rarely be stored first; status records order events
		// by JobSeq and attempt, not by arrival).
		ev := protocol.StatusEvent{V: protocol.SchemaVersion, ID: job.ID, Tenant: job.Tenant, State: protocol.StateQueued,
			JobSeq: ack.Sequence, At: time.Now().UTC(), Metadata: job.Metadata}
		ev.Session = job.Session != nil
		ev.Prompt = protocol.PromptPreview(job.Prompt)
		ev.Trigger = job.Trigger
		ev.TraceID = traceID
		if err := h.publishJSON(ctx, n.QueryStatus(job.Tenant, job.ID), ev, ""); err != nil {
			h.log.Warn().Err(err).Str("query_id", job.ID).Msg("publishing the queued status")
		}
	}
	h.log.Info().Str("tenant", job.Tenant).Str("query_id", job.ID).Bool("duplicate", ack.Duplicate).Msg("job submitted")
	return protocol.SubmitReply{ID: job.ID, Tenant: job.Tenant, Duplicate: ack.Duplicate, Subjects: &protocol.QuerySubjects{
		Msg: n.QueryMsg(job.Tenant, job.ID), Status: n.QueryStatus(job.Tenant, job.ID), Ctl: n.QueryCtl(job.Tenant, job.ID),
	}}
}

// cancel records a cancel of ref on its .ctl subject, and ends the query
// at once when no worker holds it: queued, or a parked session.
func (h *api) cancel(ctx context.Context, ref protocol.QueryRef) protocol.APIReply {
	if st, err := h.index.lookup(ctx, ref); err == nil && st.State.Terminal() {
		return protocol.APIReply{Status: st, Error: apiError("already_finished", "the query already ended as "+string(st.State))}
	}
	// Published to the stream: a worker that picks the job up later still
	// sees it, so a queued job is never started.
	if err := h.publishJSON(ctx, h.names.QueryCtl(ref.Tenant, ref.ID), protocol.CtlOp{Op: protocol.OpCancel}, ""); err != nil {
		return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
	}
	h.log.Info().Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("cancel requested")
	st, err := h.queued.cancelQueued(ctx, ref)
	if err != nil {
		// The cancel is on record; the worker that takes the job ends it.
		h.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("ending the queued query at once")
	}
	if st == nil {
		// A parked session: ended here, or already by the sessions
		// consumer from the .ctl cancel (then the reply says how).
		if st, err = h.sessions.cancelParked(ctx, ref.Tenant, ref.ID); err != nil {
			h.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("ending the parked session at once")
		}
	}
	return protocol.APIReply{OK: true, Status: st}
}

// status answers ref's latest status.
func (h *api) status(ctx context.Context, ref protocol.QueryRef) protocol.APIReply {
	st, err := h.index.lookup(ctx, ref)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return protocol.APIReply{Error: apiError(protocol.CodeNotFound, "no query "+ref.Tenant+"/"+ref.ID)}
	case err != nil:
		return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
	}
	return protocol.APIReply{OK: true, Status: st}
}

// list answers the newest statuses, or dead letters, of req (its Limit
// between 1 and 1000).
func (h *api) list(ctx context.Context, req protocol.ListRequest) protocol.APIReply {
	if req.DeadLetters {
		dls, err := h.dead.list(ctx, req.Tenant, req.Limit)
		if err != nil {
			return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
		}
		return protocol.APIReply{OK: true, DeadLetters: dls}
	}
	all, err := storage.ListStatus(ctx, h.statusStore, req.Tenant, 0)
	if err != nil {
		return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
	}
	out := make([]protocol.StatusEvent, 0, req.Limit)
	for _, ev := range all {
		if req.State != "" && ev.State != req.State {
			continue
		}
		out = append(out, ev)
		if len(out) == req.Limit {
			break
		}
	}
	return protocol.APIReply{OK: true, Queries: out}
}

// sessionOp records a session op on the query's .ctl subject, unless the
// query ended.
func (h *api) sessionOp(ctx context.Context, r opRequest) protocol.APIReply {
	ref := r.ref
	st, err := h.index.lookup(ctx, ref)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return protocol.APIReply{Error: apiError(protocol.CodeNotFound, "no query "+ref.Tenant+"/"+ref.ID)}
	case err != nil:
		return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
	case st.State.Terminal():
		return protocol.APIReply{Status: st, Error: apiError("already_finished", "the query already ended as "+string(st.State))}
	}
	if e := h.checkSession(ctx, ref, st); e != nil {
		return protocol.APIReply{Status: st, Error: e}
	}
	if r.ctl.Op == protocol.OpApprove {
		if e := h.checkApproval(ctx, ref, r.ctl.RequestID); e != nil {
			return protocol.APIReply{Status: st, Error: e}
		}
	}
	if err := h.publishJSON(ctx, h.names.QueryCtl(ref.Tenant, ref.ID), r.ctl, ""); err != nil {
		return protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())}
	}
	return protocol.APIReply{OK: true, Status: st}
}
