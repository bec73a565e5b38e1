package admission

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// traceAdmit records a job's admission as a fleet.admit span, from the
// time it was queued to now, a child of the job's traceparent header (a
// job without one, or with a malformed one, gets no span: the trace is
// the producer's or the dispatcher's to start). reason is why it waited
// ("" when it was not announced waiting).
func (a *Admitter) traceAdmit(h nats.Header, tenant string, queued time.Time, reason string) {
	if !a.cfg.Tracing.On() {
		return
	}
	m := map[string][]string(h)
	parent, ok := tracing.WithTraceparent(context.Background(), tracing.HeaderValue(m, tracing.HeaderTraceparent),
		tracing.HeaderValue(m, tracing.HeaderTracestate))
	if !ok {
		return
	}
	now := time.Now()
	attrs := []attribute.KeyValue{tracing.FleetTenant.String(tenant),
		attribute.Int64("fleet.admission.wait_ms", now.Sub(queued).Milliseconds())}
	if reason != "" {
		attrs = append(attrs, attribute.String("fleet.admission.reason", reason))
	}
	_, span := a.cfg.Tracing.Tracer().Start(parent, "fleet.admit", trace.WithTimestamp(queued),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(now))
}
