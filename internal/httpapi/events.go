package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// sse writes Server-Sent Events; writes from the follower and the
// heartbeat are serialised.
type sse struct {
	mu sync.Mutex
	w  http.ResponseWriter
	fl http.Flusher
}

// event writes one event. data holds no newline in the fleet's lines; any CR
// or LF in it (a non-JSON line) splits it over several data fields, which
// an SSE client joins with LF.
func (s *sse) event(name, id string, data []byte) {
	var b bytes.Buffer
	b.WriteString("event: " + name + "\n")
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	for _, part := range bytes.FieldsFunc(data, func(r rune) bool { return r == '\n' || r == '\r' }) {
		b.WriteString("data: ")
		b.Write(part)
		b.WriteByte('\n')
	}
	if len(bytes.TrimSpace(data)) == 0 {
		b.WriteString("data: \n")
	}
	b.WriteByte('\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(b.Bytes())
	s.fl.Flush()
}

func (s *sse) comment(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write([]byte(": " + text + "\n\n"))
	s.fl.Flush()
}

// events streams a query: every .msg line as "message" with id: Fleet-Seq,
// every status event as "status", every .model event (a metered model
// call) as "model", from the first message in stream order
// (FLEET_QUERIES, an ordered consumer), then live until the query's
// terminal status, when the stream ends. With Last-Event-ID N it resumes
// after line N: everything up to and including that line is skipped.
func (a *API) events(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	last, err := parseLastEventID(r.Header.Get("Last-Event-ID"))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, CodeInternal, "streaming unsupported")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	_, found := a.exists(ctx, w, ref)
	cancel()
	if !found {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, fl: fl}
	s.comment("query " + ref.ID)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(a.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s.comment("heartbeat")
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	skipping := last > 0
	_, err = a.cfg.Client.Follow(r.Context(), ref.Tenant, ref.ID, true, fleetapi.Follower{
		// A query whose messages aged out of the stream ends with its
		// status record instead of waiting for messages that will not come.
		MustExist: true,
		Line: func(l fleetapi.Line) {
			if skipping {
				if l.Seq <= last {
					skipping = l.Seq < last
					return
				}
				skipping = false
			}
			s.event("message", strconv.FormatUint(l.Seq, 10), l.Data)
		},
		// A model call the gateway metered (docs/gateway.md), as it is stored.
		Model: func(_ time.Time, data []byte) {
			if !skipping {
				s.event("model", "", data)
			}
		},
		Status: func(ev protocol.StatusEvent) {
			if skipping {
				return
			}
			b, err := json.Marshal(ev)
			if err == nil {
				s.event("status", "", b)
			}
		},
	})
	if err != nil && r.Context().Err() == nil {
		a.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("following a query for SSE")
		b, _ := json.Marshal(ErrorBody{Error: ErrorInfo{Code: CodeInternal, Message: err.Error()}})
		s.event("error", "", b)
	}
}
