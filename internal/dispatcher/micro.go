package dispatcher

// The API on NATS: <prefix>.api.{submit,cancel,status,list} and the
// session ops <prefix>.api.{input,interrupt,approve,end}, the endpoints of
// the NATS micro service "agentfleet", served by a queue group so several
// dispatchers share the requests.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// apiTimeout bounds answering one request.
const apiTimeout = 10 * time.Second

// sessionOps are the ops served as <prefix>.api.<op>.
var sessionOps = []string{protocol.OpInput, protocol.OpInterrupt, protocol.OpApprove, protocol.OpEnd}

// endpoints is the micro service "agentfleet" whose endpoints are the API
// subjects, so `nats micro ls|info|stats agentfleet` find every
// dispatcher, its endpoints and their request counts, errors and latency.
type endpoints struct {
	nc    *nats.Conn
	names protocol.Names
	api   *api
	svc   micro.Service
}

func (e *endpoints) start(context.Context) error {
	n, h := e.names, e.api
	svc, err := micro.AddService(e.nc, micro.Config{
		Name:        protocol.ServiceName,
		Version:     buildinfo.SemVer(),
		Description: "agentfleet dispatcher: submit, cancel, status and list of query jobs",
		QueueGroup:  queueGroup,
		Metadata:    map[string]string{"prefix": n.Prefix(), "build": buildinfo.Version()},
	})
	if err != nil {
		return fmt.Errorf("dispatcher: micro service: %w", err)
	}
	type ep struct {
		name, subject string
		h             micro.HandlerFunc
	}
	eps := []ep{
		{"submit", n.APISubmit(), serve(decodeTracedSubmit, submitFailed, h.submitTraced)},
		{"cancel", n.APICancel(), serve(decodeRefRequest, apiFailed, h.cancel)},
		{"status", n.APIStatus(), serve(decodeRefRequest, apiFailed, h.status)},
		{"list", n.APIList(), serve(decodeListRequest, apiFailed, h.list)},
		{"schedule", n.APISchedule(), serve(decodeScheduleRequest, scheduleFailed, h.schedule)},
		{"trigger", trigger.Subject(n), serve(decodeTriggerRequest, triggerFailed, h.trigger)},
		{"github", github.Subject(n), serve(decodeGitHubRequest, githubFailed, h.github)},
	}
	for _, op := range sessionOps {
		eps = append(eps, ep{op, n.APISessionOp(op), serve(decodeOpRequest(op), apiFailed, h.sessionOp)})
	}
	for _, ep := range eps {
		if err := svc.AddEndpoint(ep.name, ep.h, micro.WithEndpointSubject(ep.subject)); err != nil {
			_ = svc.Stop()
			return fmt.Errorf("dispatcher: endpoint %s: %w", ep.subject, err)
		}
	}
	e.svc = svc
	return nil
}

// stop drains the endpoints' subscriptions.
func (e *endpoints) stop(context.Context) error {
	if e.svc == nil {
		return nil
	}
	err := e.svc.Stop()
	e.svc = nil
	return err
}

// serve makes an endpoint's handler: decode the request, answer it with
// handle (within apiTimeout), reply with the answer as JSON. A request
// that does not decode is answered fail(why).
func serve[Req, Rep any](decode func(micro.Request) (Req, *protocol.ErrorInfo), fail func(*protocol.ErrorInfo) Rep,
	handle func(context.Context, Req) Rep) micro.HandlerFunc {
	return func(m micro.Request) {
		req, e := decode(m)
		if e != nil {
			reply(m, fail(e))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		reply(m, handle(ctx, req))
	}
}

func reply(m micro.Request, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"error":{"code":"internal","message":"encoding the reply"}}`)
	}
	_ = m.Respond(b)
}

func submitFailed(e *protocol.ErrorInfo) protocol.SubmitReply { return protocol.SubmitReply{Error: e} }
func apiFailed(e *protocol.ErrorInfo) protocol.APIReply       { return protocol.APIReply{Error: e} }

func decodeSubmit(m micro.Request) (*protocol.Job, *protocol.ErrorInfo) {
	return decodeJob(m.Headers().Get(protocol.HeaderContentType), m.Data())
}

func scheduleFailed(e *protocol.ErrorInfo) protocol.ScheduleReply {
	return protocol.ScheduleReply{Error: e}
}

func decodeScheduleRequest(m micro.Request) (protocol.ScheduleRequest, *protocol.ErrorInfo) {
	return decodeSchedule(m.Data())
}

func triggerFailed(e *protocol.ErrorInfo) trigger.Reply { return trigger.Reply{Error: e} }

func decodeTriggerRequest(m micro.Request) (trigger.Request, *protocol.ErrorInfo) {
	return decodeTrigger(m.Data())
}

func decodeRefRequest(m micro.Request) (protocol.QueryRef, *protocol.ErrorInfo) {
	return decodeRef(m.Data())
}

func decodeListRequest(m micro.Request) (protocol.ListRequest, *protocol.ErrorInfo) {
	return decodeList(m.Data())
}

func decodeOpRequest(op string) func(micro.Request) (opRequest, *protocol.ErrorInfo) {
	return func(m micro.Request) (opRequest, *protocol.ErrorInfo) {
		ref, ctl, e := decodeSessionOp(op, m.Data())
		return opRequest{ref: ref, ctl: ctl}, e
	}
}
