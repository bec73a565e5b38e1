package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// Header names of the W3C trace context (HTTP and NATS headers).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// ValidTraceparent reports whether s has the W3C traceparent form the
// fleet accepts: 00-<32 hex>-<16 hex>-<2 hex> (lower-case hex, version 00).
func ValidTraceparent(s string) bool {
	if len(s) != 55 || s[0:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	for i, c := range []byte(s) {
		if i < 3 || i == 35 || i == 52 {
			continue
		}
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// WithTraceparent is ctx carrying the remote span context of a producer's
// traceparent (and tracestate): a valid one (ValidTraceparent, with a
// non-zero trace and span id) is taken, anything else is ignored (ok
// false, ctx unchanged).
func WithTraceparent(ctx context.Context, traceparent, tracestate string) (context.Context, bool) {
	if !ValidTraceparent(traceparent) {
		return ctx, false
	}
	return Extract(ctx, traceparent, tracestate)
}

// HeaderValue is the first value of name in h matched in any case (NATS
// header names are case-sensitive; producers write them either way).
func HeaderValue(h map[string][]string, name string) string {
	for k, v := range h {
		if len(v) > 0 && len(k) == len(name) && foldEqual(k, name) {
			return v[0]
		}
	}
	return ""
}

func foldEqual(a, b string) bool {
	for i := range len(a) {
		if a[i]|0x20 != b[i]|0x20 {
			return false
		}
	}
	return true
}

// HasSpan reports whether ctx carries a valid span context.
func HasSpan(ctx context.Context) bool { return trace.SpanContextFromContext(ctx).IsValid() }
