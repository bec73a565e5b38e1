package dispatcher

// The trace context of submitted jobs: a producer's traceparent (the HTTP
// API's header, a fleet.api.submit request's NATS header) is carried on
// the context to submit, which sets it on the job message; without one,
// and with tracing on, the dispatcher starts the trace with a
// fleet.submit span.

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// tracedJob is a submit request with its trace context headers.
type tracedJob struct {
	job                     *protocol.Job
	traceparent, tracestate string
}

func decodeTracedSubmit(m micro.Request) (tracedJob, *protocol.ErrorInfo) {
	job, e := decodeSubmit(m)
	if e != nil {
		return tracedJob{}, e
	}
	h := map[string][]string(m.Headers())
	return tracedJob{job: job, traceparent: tracing.HeaderValue(h, tracing.HeaderTraceparent),
		tracestate: tracing.HeaderValue(h, tracing.HeaderTracestate)}, nil
}

// submitTraced is submit within the request's trace (a malformed
// traceparent is ignored).
func (h *api) submitTraced(ctx context.Context, r tracedJob) protocol.SubmitReply {
	if r.traceparent != "" {
		var ok bool
		if ctx, ok = tracing.WithTraceparent(ctx, r.traceparent, r.tracestate); !ok {
			h.log.Debug().Str("tenant", r.job.Tenant).Str("query_id", r.job.ID).Msg("the request's traceparent is malformed; ignored")
		}
	}
	return h.submit(ctx, r.job)
}

// traceJob sets the job message's traceparent (and tracestate) header:
// ctx's span context (the producer's), else, with tracing on, that of a
// new root fleet.submit span that ends with end(publishing error). It
// answers the trace id ("" when there is none).
func (h *api) traceJob(ctx context.Context, job *protocol.Job, hdr nats.Header) (traceID string, end func(error)) {
	end = func(error) {}
	if !tracing.HasSpan(ctx) && h.tracing.On() {
		var span trace.Span
		ctx, span = h.tracing.Tracer().Start(ctx, "fleet.submit", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(tracing.FleetTenant.String(job.Tenant), tracing.FleetQueryID.String(job.ID)))
		end = func(err error) {
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
	}
	tp, ts := tracing.Inject(ctx)
	if tp == "" {
		return "", end
	}
	hdr.Set(tracing.HeaderTraceparent, tp)
	if ts != "" {
		hdr.Set(tracing.HeaderTracestate, ts)
	}
	return tracing.TraceID(ctx), end
}
