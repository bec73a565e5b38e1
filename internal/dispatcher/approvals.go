package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Error codes of a session op that cannot apply.
const (
	codeNoSuchRequest   = "no_such_request"
	codeAlreadyAnswered = "already_answered"
	codeNotASession     = "not_a_session"
)

// checkSession says why a session op cannot apply to the query whose last
// status is st, or nil: the query must be a session. Its statuses say so
// ("session":true, and idle, parked and awaiting_approval are a session's
// alone; the submit API's queued status is marked too); the admitter's
// queued announcements are not, and are decided by the job itself, read
// from the queue.
func (q queryDeps) checkSession(ctx context.Context, ref protocol.QueryRef, st *protocol.StatusEvent) *protocol.ErrorInfo {
	switch {
	case st.Session:
		return nil
	case st.State == protocol.StateIdle, st.State == protocol.StateParked, st.State == protocol.StateAwaitingApproval:
		return nil
	case st.State == protocol.StateQueued && st.Worker == "" && st.Reason == "":
		// The submit API's own queued status: it marks sessions, so an
		// unmarked one is a one-shot's.
	case st.State == protocol.StateQueued && st.Worker == "":
		// The admitter's announcement of why a job waits: unmarked; the
		// job in the queue says.
		if st.JobSeq == 0 {
			return nil // not known: the worker ignores what it cannot apply
		}
		stream, err := q.js.Stream(ctx, q.names.JobsStream())
		if err != nil {
			return nil
		}
		raw, err := stream.GetMsg(ctx, st.JobSeq)
		if err != nil {
			return nil // admitted or gone: not known here
		}
		job, err := protocol.DecodeJob(raw.Header.Get(protocol.HeaderContentType), raw.Data)
		if err != nil || job.Session != nil {
			return nil
		}
	}
	return apiError(codeNotASession, fmt.Sprintf("%s/%s is not a session (a one-shot query takes no input, approval or end); nothing sent", ref.Tenant, ref.ID))
}

// checkApproval says why an approval of requestID cannot apply to the
// query, or nil when it can: the query's agent must have asked it (an
// awaiting_approval status naming it) and nobody answered it yet (no
// approve on .ctl naming it). It reads the query's status and control
// history from FLEET_QUERIES, where both are kept.
//
// A request the history does not name yet is waited for, up to
// approvalWait: the agent's control_request line on .msg can reach a
// client before the worker's awaiting_approval status for it (a request
// queued behind another is announced when the one before it is
// answered), and a client answering what it saw is not wrong.
func (q queryDeps) checkApproval(ctx context.Context, ref protocol.QueryRef, requestID string) *protocol.ErrorInfo {
	asked, answered, err := q.approvals(ctx, ref, requestID)
	if err != nil {
		return apiError(protocol.CodeInternal, err.Error())
	}
	switch {
	case answered:
		return apiError(codeAlreadyAnswered, fmt.Sprintf("permission request %s of %s/%s was already answered", requestID, ref.Tenant, ref.ID))
	case !asked:
		return apiError(codeNoSuchRequest, fmt.Sprintf("%s/%s has no permission request %s", ref.Tenant, ref.ID, requestID))
	}
	return nil
}

// approvalWait bounds how long checkApproval waits for a request the
// query's history does not name yet.
const approvalWait = 3 * time.Second

// approvals reads the query's status and control history and says whether
// its agent asked requestID (an awaiting_approval status naming it) and
// whether it was answered (an approve on .ctl naming it). When the history
// read so far names it neither way, it goes on reading what arrives, up to
// approvalWait.
func (q queryDeps) approvals(ctx context.Context, ref protocol.QueryRef, requestID string) (asked, answered bool, err error) {
	statusSubj, ctlSubj := q.names.QueryStatus(ref.Tenant, ref.ID), q.names.QueryCtl(ref.Tenant, ref.ID)
	cons, err := q.js.OrderedConsumer(ctx, q.names.QueriesStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{statusSubj, ctlSubj},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return false, false, fmt.Errorf("reading the query's history: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, false, fmt.Errorf("reading the query's history: %w", err)
	}
	note := func(m jetstream.Msg) {
		switch m.Subject() {
		case statusSubj:
			var ev protocol.StatusEvent
			if json.Unmarshal(m.Data(), &ev) == nil && ev.State == protocol.StateAwaitingApproval && ev.RequestID == requestID {
				asked = true
			}
		case ctlSubj:
			op, err := protocol.DecodeCtlOp(m.Headers().Get(protocol.HeaderContentType), m.Data())
			if err == nil && op.Op == protocol.OpApprove && op.RequestID == requestID {
				answered = true
			}
		}
	}
	for n := info.NumPending; n > 0; n-- {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return false, false, fmt.Errorf("reading the query's history: %w", err)
		}
		note(m)
	}
	if asked || answered {
		return asked, answered, nil
	}
	wctx, cancel := context.WithTimeout(ctx, approvalWait)
	defer cancel()
	for !asked && !answered {
		m, err := cons.Next(jetstream.FetchContext(wctx))
		if err != nil {
			if ctx.Err() == nil && (wctx.Err() != nil || errors.Is(err, nats.ErrTimeout)) {
				return false, false, nil // not asked within approvalWait
			}
			return false, false, fmt.Errorf("reading the query's history: %w", err)
		}
		note(m)
	}
	return asked, answered, nil
}
