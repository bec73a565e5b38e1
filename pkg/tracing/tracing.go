package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Bounds of the batch span processor: at most MaxQueue spans wait for
// export (more are dropped), sent in batches of at most MaxBatch.
const (
	MaxQueue = 4096
	MaxBatch = 512
)

// Tracing is a command's tracer provider.
type Tracing struct {
	tp      *sdktrace.TracerProvider // nil when off
	tracer  trace.Tracer
	dropped *atomic.Uint64
}

// Enabled reports whether the environment asks for traces (an OTLP
// endpoint is set).
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Start sets up tracing from the environment for the named service
// (OTEL_SERVICE_NAME, when set, names it instead). Off (no endpoint):
// a no-op Tracing. Errors: an unsupported OTEL_EXPORTER_OTLP_PROTOCOL, or
// an exporter that cannot be made from the settings.
func Start(ctx context.Context, service string, log zerolog.Logger) (*Tracing, error) {
	t := &Tracing{dropped: &atomic.Uint64{}}
	if !Enabled() {
		t.tracer = noop.NewTracerProvider().Tracer("agentfleet")
		return t, nil
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("tracing: %s=%q: only http/protobuf is supported", v, p)
		}
	}
	return start(ctx, service, log)
}

// StartEndpoint is Start exporting to the OTLP/HTTP collector at url
// (http://host:port), whatever the environment says (tests).
func StartEndpoint(ctx context.Context, service, url string, log zerolog.Logger) (*Tracing, error) {
	return start(ctx, service, log, otlptracehttp.WithEndpointURL(strings.TrimSuffix(url, "/")+"/v1/traces"))
}

func start(ctx context.Context, service string, log zerolog.Logger, opts ...otlptracehttp.Option) (*Tracing, error) {
	t := &Tracing{dropped: &atomic.Uint64{}}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(serviceName(service)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
		res, _ = resource.Merge(res, resource.NewSchemaless(serviceName(v)))
	}
	counted := &countingExporter{SpanExporter: exp, dropped: t.dropped, log: log}
	t.tp = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithBatcher(counted, sdktrace.WithMaxQueueSize(MaxQueue), sdktrace.WithMaxExportBatchSize(MaxBatch),
			sdktrace.WithBatchTimeout(time.Second), sdktrace.WithExportTimeout(10*time.Second)),
	)
	t.tracer = t.tp.Tracer("github.com/agentfleet/agentfleet")
	log.Info().Str("service", service).Msg("tracing: exporting spans over OTLP/HTTP")
	return t, nil
}

// Off is a Tracing that makes no spans (tests, tools).
func Off() *Tracing {
	return &Tracing{tracer: noop.NewTracerProvider().Tracer("agentfleet"), dropped: &atomic.Uint64{}}
}

// Tracer is the fleet's tracer (a no-op one when off or t is nil).
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return noop.NewTracerProvider().Tracer("agentfleet")
	}
	return t.tracer
}

// On reports whether spans are exported.
func (t *Tracing) On() bool { return t != nil && t.tp != nil }

// Dropped counts the spans the exporter failed to deliver.
func (t *Tracing) Dropped() uint64 {
	if t == nil {
		return 0
	}
	return t.dropped.Load()
}

// Shutdown exports what is queued (bounded by ctx) and stops.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.tp == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// ForceFlush exports what is queued now (tests).
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if t == nil || t.tp == nil {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// countingExporter counts the spans of failed exports.
type countingExporter struct {
	sdktrace.SpanExporter
	dropped *atomic.Uint64
	log     zerolog.Logger
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		n := e.dropped.Add(uint64(len(spans)))
		e.log.Debug().Err(err).Int("spans", len(spans)).Uint64("dropped_total", n).Msg("tracing: spans dropped")
	}
	return err
}

var propagator = propagation.TraceContext{}

// Extract is ctx with the remote span context of a traceparent (and
// tracestate) header pair; ok is false (and ctx unchanged) when
// traceparent is empty or malformed.
func Extract(ctx context.Context, traceparent, tracestate string) (context.Context, bool) {
	traceparent = strings.TrimSpace(traceparent)
	if traceparent == "" {
		return ctx, false
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	out := propagator.Extract(ctx, c)
	if !trace.SpanContextFromContext(out).IsValid() {
		return ctx, false
	}
	return out, true
}

// Inject returns the traceparent and tracestate of ctx's span ("" when it
// has none).
func Inject(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// TraceID is the 32-hex trace id of ctx's span, "" when it has none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.TraceID().IsValid() {
		return ""
	}
	return sc.TraceID().String()
}
