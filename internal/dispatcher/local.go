package dispatcher

// The API called in-process: the dispatcher's own HTTP API and dashboard
// answer through the same handlers as the NATS endpoints, with the same
// decoding and validation, without a NATS round trip (which the
// dispatcher's creds may not make: they serve <prefix>.api.>, they do not
// publish it).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Local is the Service's API as fleetapi.Requests. Each call is bounded
// by its context and apiTimeout; one that runs out is
// fleetapi.ErrUnavailable naming the call.
type Local struct{ s *Service }

var _ fleetapi.Requests = Local{}

// Local returns the Service's API for in-process callers (fleetapi.Client.Local).
func (s *Service) Local() Local { return Local{s: s} }

// local runs one call: refused when the Service is not running, bounded,
// and unavailable when its context ran out.
func local[Rep any](ctx context.Context, l Local, what string, call func(context.Context) Rep) (Rep, error) {
	var zero Rep
	if !l.s.Running() {
		return zero, fmt.Errorf("%w: %s: the dispatcher is not running", fleetapi.ErrUnavailable, what)
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	rep := call(ctx)
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return zero, fmt.Errorf("%w: %s did not finish in time: %w", fleetapi.ErrUnavailable, what, err)
		}
		return zero, err
	}
	return rep, nil
}

// Submit decodes and validates job as <prefix>.api.submit does, and queues it.
func (l Local) Submit(ctx context.Context, job protocol.Job) (protocol.SubmitReply, error) {
	b, err := json.Marshal(job)
	if err != nil {
		return protocol.SubmitReply{}, err
	}
	j, e := decodeJob(protocol.ContentTypeJSON, b)
	if e != nil {
		return protocol.SubmitReply{Error: e}, nil
	}
	return local(ctx, l, "submit", func(ctx context.Context) protocol.SubmitReply { return l.s.api.submit(ctx, j) })
}

// Cancel is <prefix>.api.cancel.
func (l Local) Cancel(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error) {
	r, e := reencode(ref, decodeRef)
	if e != nil {
		return protocol.APIReply{Error: e}, nil
	}
	return local(ctx, l, "cancel", func(ctx context.Context) protocol.APIReply { return l.s.api.cancel(ctx, r) })
}

// Status is <prefix>.api.status.
func (l Local) Status(ctx context.Context, ref protocol.QueryRef) (protocol.APIReply, error) {
	r, e := reencode(ref, decodeRef)
	if e != nil {
		return protocol.APIReply{Error: e}, nil
	}
	return local(ctx, l, "status", func(ctx context.Context) protocol.APIReply { return l.s.api.status(ctx, r) })
}

// List is <prefix>.api.list.
func (l Local) List(ctx context.Context, req protocol.ListRequest) (protocol.APIReply, error) {
	r, e := reencode(req, decodeList)
	if e != nil {
		return protocol.APIReply{Error: e}, nil
	}
	return local(ctx, l, "list", func(ctx context.Context) protocol.APIReply { return l.s.api.list(ctx, r) })
}

// SessionOp is <prefix>.api.<op> of a session op.
func (l Local) SessionOp(ctx context.Context, op string, req protocol.SessionOpRequest) (protocol.APIReply, error) {
	known := false
	for _, o := range sessionOps {
		known = known || o == op
	}
	if !known {
		return protocol.APIReply{Error: apiError(protocol.CodeInvalidJob, "not a session op: "+op)}, nil
	}
	r, e := reencode(req, func(b []byte) (opRequest, *protocol.ErrorInfo) {
		ref, ctl, e := decodeSessionOp(op, b)
		return opRequest{ref: ref, ctl: ctl}, e
	})
	if e != nil {
		return protocol.APIReply{Error: e}, nil
	}
	return local(ctx, l, op, func(ctx context.Context) protocol.APIReply { return l.s.api.sessionOp(ctx, r) })
}

// Schedule is <prefix>.api.schedule.
func (l Local) Schedule(ctx context.Context, req protocol.ScheduleRequest) (protocol.ScheduleReply, error) {
	r, e := reencode(req, decodeSchedule)
	if e != nil {
		return protocol.ScheduleReply{Error: e}, nil
	}
	return local(ctx, l, "schedule", func(ctx context.Context) protocol.ScheduleReply { return l.s.api.schedule(ctx, r) })
}

// reencode decodes v as its NATS request would be: encoded, then read by
// the endpoint's decoder.
func reencode[In, Out any](v In, decode func([]byte) (Out, *protocol.ErrorInfo)) (Out, *protocol.ErrorInfo) {
	b, err := json.Marshal(v)
	if err != nil {
		var zero Out
		return zero, apiError(protocol.CodeInternal, err.Error())
	}
	return decode(b)
}
