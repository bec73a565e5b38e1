// Package tracing sets up OpenTelemetry traces for the fleet's commands:
// an OTLP/HTTP (protobuf) exporter configured by the standard variables
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and
// the exporter's other OTEL_EXPORTER_OTLP_* settings), behind a batch span
// processor with a bounded queue. With no endpoint set tracing is off: the
// tracer is OpenTelemetry's no-op one and costs nothing.
//
// The command that starts a Tracing owns it and shuts it down (flushing
// what is queued) after the services that make spans have stopped. Spans
// the collector did not take (unreachable, refusing) are dropped and
// counted (Dropped); the runs are never held up by tracing.
//
// It also carries the W3C trace context in NATS headers (Extract, Inject)
// and as the agent's TRACEPARENT.
package tracing
