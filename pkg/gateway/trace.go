package gateway

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// chatTrace is the span of one model call: "chat <model>", a child of its
// run's trace context (RunInfo.Traceparent), whose traceparent the
// upstream request carries. Unmetered calls (no model answer to read) get
// no span, but still carry the run's traceparent.
type chatTrace struct {
	span trace.Span // nil: none
}

// chatSpan starts the call's span and sets the upstream request's
// traceparent (and tracestate).
func (g *Gateway) chatSpan(r *run, out *http.Request, metered bool) chatTrace {
	out.Header.Del("Traceparent")
	out.Header.Del("Tracestate")
	parent, ok := tracing.Extract(context.Background(), r.info.Traceparent, r.info.Tracestate)
	if !ok {
		return chatTrace{}
	}
	var ct chatTrace
	ctx := parent
	if metered {
		ctx, ct.span = g.cfg.Tracing.Tracer().Start(parent, "chat", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			tracing.GenAIOperationName.String("chat"), tracing.GenAIProviderName.String("anthropic"),
			tracing.FleetTenant.String(r.info.Tenant), tracing.FleetQueryID.String(r.info.QueryID)))
	}
	if tp, ts := tracing.Inject(ctx); tp != "" {
		out.Header.Set("Traceparent", tp)
		if ts != "" {
			out.Header.Set("Tracestate", ts)
		}
	}
	return ct
}

// fail records that the upstream could not be reached.
func (t chatTrace) fail(err error) {
	if t.span != nil {
		t.span.SetStatus(codes.Error, err.Error())
		t.span.SetAttributes(tracing.ErrorType.String("upstream_unreachable"))
	}
}

// firstByte records the time to the answer's headers.
func (t chatTrace) firstByte(c *call) {
	if t.span != nil {
		t.span.SetAttributes(tracing.FleetTimeToFirstByteMS.Int64(time.Since(c.start).Milliseconds()),
			tracing.HTTPResponseStatusCode.Int(c.status))
		if c.status >= 400 {
			t.span.SetStatus(codes.Error, "HTTP "+strconv.Itoa(c.status))
			t.span.SetAttributes(tracing.ErrorType.String(strconv.Itoa(c.status)))
		}
	}
}

// end ends the span with what the meter read of the call.
func (t chatTrace) end(c *call) {
	if t.span == nil {
		return
	}
	if c.model != "" {
		t.span.SetName("chat " + c.model)
		t.span.SetAttributes(tracing.GenAIRequestModel.String(c.model))
	}
	t.span.SetAttributes(tracing.GenAIUsageInputTokens.Int64(c.usage.InputTokens+c.usage.CacheReadInputTokens+c.usage.CacheCreationInputTokens),
		tracing.GenAIUsageOutputTokens.Int64(c.usage.OutputTokens))
	t.span.End()
}
