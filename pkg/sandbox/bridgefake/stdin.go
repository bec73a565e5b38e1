package bridgefake

import (
	"io"
	"net/http"
	"os"
	"strconv"
)

// stdinState is the interactive stdin of a process started with
// "stdin": "pipe" (the bridge's FIFO, here an os.Pipe). Guarded by its
// proc's mu except w's writes, which are serialized by the writing handler.
type stdinState struct {
	w       *os.File
	applied int64
	closed  bool
}

// FailStdinWrites makes the next n stdin writes fail with 503. With
// afterApply, each is applied (and recorded) before the 503, as when the
// bridge's answer is lost: the client's retry must not apply it twice.
func (f *Fake) FailStdinWrites(n int, afterApply bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failStdin, f.failStdinAfter = n, afterApply
}

// StdinWrites reports how many stdin write requests reached proc procID
// (retries included).
func (f *Fake) StdinWrites(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stdinWrites[procID]
}

func (f handlers) takeStdinFault() (fail, afterApply bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failStdin == 0 {
		return false, false
	}
	f.failStdin--
	return true, f.failStdinAfter
}

// maxStdinWrite is the bridge's limit on one write (README "Interactive stdin").
const maxStdinWrite = 64 << 10

func (f handlers) handleStdin(w http.ResponseWriter, r *http.Request, _ *sandbox, p *proc) {
	f.mu.Lock()
	f.stdinWrites[p.id]++
	f.mu.Unlock()
	off, err := strconv.ParseInt(r.URL.Query().Get("off"), 10, 64)
	if err != nil || off < 0 {
		writeError(w, http.StatusBadRequest, "invalid_offset", "off must be a non-negative integer")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxStdinWrite+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if len(body) > maxStdinWrite {
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large", "stdin write larger than 64 KiB")
		return
	}
	p.stdinMu.Lock() // one write at a time, as the bridge's single writer
	defer p.stdinMu.Unlock()
	p.mu.Lock()
	st, exited := p.stdin, p.exited
	var applied int64
	var closed bool
	if st != nil {
		applied, closed = st.applied, st.closed
	}
	p.mu.Unlock()
	if st == nil {
		writeError(w, http.StatusConflict, "not_interactive", "process was not started with stdin \"pipe\"")
		return
	}
	end := off + int64(len(body))
	switch {
	case off > applied:
		writeJSON(w, http.StatusConflict, map[string]any{"error": "write past the applied end", "code": "stdin_gap", "off": applied})
		return
	case end <= applied:
		writeJSON(w, http.StatusOK, map[string]int64{"off": applied})
		return
	case exited:
		writeError(w, http.StatusConflict, "proc_exited", "process has exited")
		return
	case closed:
		writeError(w, http.StatusConflict, "stdin_closed", "stdin is closed")
		return
	}
	fail, afterApply := f.takeStdinFault()
	if fail && !afterApply {
		writeError(w, http.StatusServiceUnavailable, "stdin_write_failed", "scripted failure; retry")
		return
	}
	if _, err := st.w.Write(body[applied-off:]); err != nil {
		writeError(w, http.StatusConflict, "proc_exited", "process has exited: "+err.Error())
		return
	}
	p.mu.Lock()
	st.applied = end
	p.mu.Unlock()
	if fail {
		writeError(w, http.StatusServiceUnavailable, "stdin_write_failed", "scripted failure after the write; retry")
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"off": end})
}

func (f handlers) handleStdinClose(w http.ResponseWriter, _ *http.Request, _ *sandbox, p *proc) {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	p.mu.Lock()
	st := p.stdin
	if st != nil && !st.closed {
		st.closed = true
		_ = st.w.Close()
	}
	p.mu.Unlock()
	if st == nil {
		writeError(w, http.StatusConflict, "not_interactive", "process was not started with stdin \"pipe\"")
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"closed": true})
}
