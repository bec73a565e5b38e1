package bridgefake

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// streamFaults is the fault configuration a stream connection starts with.
type streamFaults struct {
	dropArmed bool
	dropAfter int64
	abort     bool
}

// takeDrop consumes one stream drop; it reports whether this connection
// should be cut now.
func (f handlers) takeDrop() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.dropTimes == 0:
		return false
	case f.dropTimes > 0:
		f.dropTimes--
	}
	return true
}

func (f handlers) handleStream(w http.ResponseWriter, r *http.Request, _ *sandbox, p *proc) {
	from, err := parseFrom(r.URL.Query().Get("from"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "internal", "streaming unsupported")
		return
	}
	f.mu.Lock()
	f.streams[p.id]++
	faults := streamFaults{dropArmed: f.dropTimes != 0, dropAfter: f.dropAfter, abort: f.dropAbort}
	f.mu.Unlock()

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache, no-transform")
	w.WriteHeader(http.StatusOK)
	fl.Flush()

	drop := func() {
		if faults.abort {
			panic(http.ErrAbortHandler)
		}
	}
	tick := time.NewTicker(f.opts.PingInterval)
	defer tick.Stop()
	var sent int64 // output bytes sent on this connection
	cursor := 0
	reached := from
	for {
		p.mu.Lock()
		pending := p.chunks[cursor:]
		cursor = len(p.chunks)
		done, status, code, changed := p.done, p.status, p.code, p.changed
		p.mu.Unlock()

		for _, c := range pending {
			data, off := c.data, c.off
			if skip := from[c.fd-1] - off; skip > 0 {
				if skip >= int64(len(data)) {
					continue
				}
				data, off = data[skip:], off+skip
			}
			if faults.dropArmed && sent+int64(len(data)) > faults.dropAfter {
				if !f.takeDrop() {
					faults.dropArmed = false
				} else {
					if n := faults.dropAfter - sent; n > 0 {
						writeOut(w, c.fd, off, data[:n])
						reached[c.fd-1] = off + n
					}
					fl.Flush()
					p.markSent(reached)
					drop()
					return
				}
			}
			writeOut(w, c.fd, off, data)
			sent += int64(len(data))
			reached[c.fd-1] = off + int64(len(data))
		}
		if len(pending) > 0 {
			fl.Flush()
			p.markSent(reached)
		}
		if done {
			if f.writeEnd(w, fl, code, status) {
				return
			}
			changed = nil // ExitHang: nothing more will happen; ping until the client leaves
		}
		fl.Flush()
		select {
		case <-changed:
		case <-tick.C:
			f.mu.Lock()
			ping := !f.noPings
			f.mu.Unlock()
			if ping {
				_, _ = io.WriteString(w, ": ping\n\n")
				fl.Flush()
			}
		case <-r.Context().Done():
			return
		case <-f.closing:
			return
		}
	}
}

// writeEnd ends a stream of an exited process as the exit mode says; it
// reports false for ExitHang, whose stream stays open.
func (f handlers) writeEnd(w io.Writer, fl http.Flusher, code int, status string) bool {
	f.mu.Lock()
	mode := f.exitMode
	f.mu.Unlock()
	switch mode {
	case ExitNormal:
		writeEvent(w, "exit", map[string]any{"code": code, "status": status})
	case ExitError:
		writeEvent(w, "error", map[string]string{"code": "exec_transport_error", "message": "injected stream error"})
	case ExitHang:
		return false
	}
	fl.Flush()
	return true
}

func writeOut(w io.Writer, fd int, off int64, data []byte) {
	writeEvent(w, "out", map[string]any{"fd": fd, "off": off, "b64": base64.StdEncoding.EncodeToString(data)})
}

func writeEvent(w io.Writer, name string, v any) {
	b, _ := json.Marshal(v)
	_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
}
