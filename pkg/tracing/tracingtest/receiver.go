// Package tracingtest is an in-process OTLP/HTTP (protobuf) trace
// receiver for tests: it keeps every span it is sent.
package tracingtest

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	Name, TraceID, SpanID, ParentID string
	Attrs                           map[string]any
	Error                           bool
}

// Receiver is an httptest server taking POST /v1/traces.
type Receiver struct {
	URL string
	mu  sync.Mutex
	s   []Span
	ch  chan struct{}
}

// New starts a receiver, closed at the end of the test.
func New(t testing.TB) *Receiver {
	r := &Receiver{ch: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
		http.NotFound(w, req)
		return
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ex collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range ex.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{Name: sp.GetName(), TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Attrs: map[string]any{},
					Error: sp.GetStatus().GetCode() == 2}
				for _, kv := range sp.GetAttributes() {
					v := kv.GetValue()
					switch {
					case v.GetStringValue() != "":
						s.Attrs[kv.GetKey()] = v.GetStringValue()
					default:
						s.Attrs[kv.GetKey()] = v.GetIntValue()
					}
				}
				got = append(got, s)
			}
		}
	}
	r.mu.Lock()
	r.s = append(r.s, got...)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	b, _ = proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(b)
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.s...)
}

// Received is signalled after each export.
func (r *Receiver) Received() <-chan struct{} { return r.ch }
