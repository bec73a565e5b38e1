package bridgefake

import (
	"bytes"
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	fleetsandbox "github.com/agentfleet/agentfleet/pkg/sandbox"
)

// handlers serves the bridge's HTTP API over the state of a Fake; the
// Fake's own methods are what a test calls.
type handlers struct{ *Fake }

// routes builds the handler.
func (f handlers) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
	mux.HandleFunc("PUT /v1/sb/{id}", f.auth(f.handleCreate))
	mux.HandleFunc("DELETE /v1/sb/{id}", f.auth(f.handleDelete))
	mux.HandleFunc("POST /v1/sb/{id}/proc", f.auth(f.withSandbox(f.handleStart)))
	mux.HandleFunc("GET /v1/sb/{id}/proc/{pid}/stream", f.auth(f.withProc(f.handleStream)))
	mux.HandleFunc("POST /v1/sb/{id}/proc/{pid}/kill", f.auth(f.withProc(f.handleKill)))
	mux.HandleFunc("POST /v1/sb/{id}/proc/{pid}/stdin", f.auth(f.withProc(f.handleStdin)))
	mux.HandleFunc("POST /v1/sb/{id}/proc/{pid}/stdin/close", f.auth(f.withProc(f.handleStdinClose)))
	mux.HandleFunc("GET /v1/sb/{id}/proc/{pid}", f.auth(f.withProc(f.handleStatus)))
	mux.HandleFunc("GET /v1/version", f.auth(func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		f.versions++
		f.mu.Unlock()
		if f.opts.Legacy {
			writeError(w, http.StatusNotFound, "not_found", "no such route")
			return
		}
		writeJSON(w, http.StatusOK, fleetsandbox.BridgeInfo{Version: fleetsandbox.BridgeVersion, Capabilities: Capabilities})
	}))
	if !f.opts.Legacy {
		mux.HandleFunc("PUT /v1/sb/{id}/model", f.auth(f.handleModelOpen))
		mux.HandleFunc("GET /v1/sb/{id}/model", f.auth(f.handleModelReport))
		mux.HandleFunc("DELETE /v1/sb/{id}/model", f.auth(f.handleModelReport))
	}
	mux.HandleFunc("PUT /v1/sb/{id}/file", f.auth(f.withSandbox(f.handlePutFile)))
	mux.HandleFunc("GET /v1/sb/{id}/file", f.auth(f.withSandbox(f.handleGetFile)))
	mux.HandleFunc("/v1/", f.auth(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route")
	}))
	return mux
}

// Capabilities is what the fake answers GET /v1/version with, as the
// bridge Worker of this release does.
var Capabilities = []string{"proc", "file", fleetsandbox.BridgeCapStdin, fleetsandbox.BridgeCapModel}

type errBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, errBody{Error: msg, Code: code})
}

// auth checks the bearer token in constant time.
func (f handlers) auth(h http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + f.opts.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			f.mu.Lock()
			f.unauthorized++
			f.mu.Unlock()
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

var (
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	procIDPattern = idPattern
)

func (f handlers) lookup(id string) *sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id]
}

func (f handlers) withSandbox(h func(http.ResponseWriter, *http.Request, *sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb := f.lookup(r.PathValue("id"))
		if sb == nil {
			writeError(w, http.StatusNotFound, "sandbox_not_found", "no such sandbox")
			return
		}
		h(w, r, sb)
	}
}

func (f handlers) withProc(h func(http.ResponseWriter, *http.Request, *sandbox, *proc)) http.HandlerFunc {
	return f.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *sandbox) {
		f.mu.Lock()
		p := sb.procs[r.PathValue("pid")]
		f.mu.Unlock()
		if p == nil {
			writeError(w, http.StatusNotFound, "process_not_found", "no such process")
			return
		}
		h(w, r, sb, p)
	})
}

// decodeBody decodes an optional JSON body (empty means zero value).
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return err
	}
	if len(b) > 1<<20 {
		return errors.New("body larger than 1 MiB")
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

func checkEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env name %q is not valid", k)
		}
	}
	return nil
}

type createReq struct {
	SleepAfter json.RawMessage   `json:"sleep_after"`
	Env        map[string]string `json:"env"`
}

func checkSleepAfter(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n float64
	if json.Unmarshal(raw, &n) == nil {
		if n < 0 {
			return errors.New("sleep_after is negative")
		}
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if _, err := time.ParseDuration(s); err == nil {
			return nil
		}
	}
	return errors.New("sleep_after must be seconds or a duration like \"10m\"")
}

func (f handlers) handleCreate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	f.mu.Lock()
	f.creates++
	fail, status, delay := f.failCreate > 0, f.failCreateStatus, f.createDelay
	if fail {
		f.failCreate--
	}
	f.mu.Unlock()
	if !idPattern.MatchString(id) {
		writeError(w, http.StatusBadRequest, "invalid_request", "sandbox id must match [A-Za-z0-9_-]{1,128}")
		return
	}
	var req createReq
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "bad body: "+err.Error())
		return
	}
	if err := cmp.Or(checkEnv(req.Env), checkSleepAfter(req.SleepAfter)); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-f.closing:
			t.Stop()
			writeError(w, http.StatusServiceUnavailable, "CONTAINER_UNAVAILABLE", "fake bridge closing")
			return
		}
	}
	if fail {
		code := "CONTAINER_UNAVAILABLE"
		if status != http.StatusServiceUnavailable {
			code = "injected_failure"
		}
		writeError(w, status, code, "injected create failure")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.closing:
		writeError(w, http.StatusServiceUnavailable, "CONTAINER_UNAVAILABLE", "fake bridge closing")
		return
	default:
	}
	sb := f.sandboxes[id]
	if sb == nil {
		dir := filepath.Join(f.opts.Dir, "sb-"+id)
		ws := filepath.Join(dir, "workspace")
		for _, d := range []string{ws, filepath.Join(dir, "home", ".claude"), filepath.Join(dir, "tmp")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				writeError(w, http.StatusInternalServerError, "internal", err.Error())
				return
			}
		}
		root, err := os.OpenRoot(ws)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		sb = &sandbox{id: id, marker: newMarker(), dir: dir, ws: ws, root: root, procs: map[string]*proc{}}
		f.sandboxes[id] = sb
	}
	sb.env = maps.Clone(req.Env)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "ready": true})
}

func (f handlers) handleDelete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.deletes++
	sb := f.sandboxes[r.PathValue("id")]
	delete(f.sandboxes, r.PathValue("id"))
	f.mu.Unlock()
	if sb != nil {
		f.destroy(sb)
	}
	f.model.closeRun(r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

// destroy kills every process group of sb, waits for them and removes its
// directory. sb must already be out of f.sandboxes.
func (f handlers) destroy(sb *sandbox) {
	f.mu.Lock()
	procs := make([]*proc, 0, len(sb.procs))
	for _, p := range sb.procs {
		procs = append(procs, p)
	}
	f.mu.Unlock()
	for _, p := range procs {
		p.signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		<-p.reaped
	}
	killMarked(sb.marker)
	_ = sb.root.Close()
	_ = os.RemoveAll(sb.dir)
}

// checkPath validates a workspace-relative path from a request.
func checkPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) || !filepath.IsLocal(p) {
		return fmt.Errorf("path %q must be relative to the workspace and stay inside it", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("path %q escapes the workspace", p)
		}
	}
	return nil
}

func (f handlers) handlePutFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p := r.URL.Query().Get("path")
	if err := checkPath(p); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_path", err.Error())
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxFileBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "read body: "+err.Error())
		return
	}
	if len(data) > MaxFileBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large", "file larger than 32 MiB")
		return
	}
	if dir := path.Dir(p); dir != "." {
		if err := sb.root.MkdirAll(dir, 0o755); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_path", "mkdir: "+err.Error())
			return
		}
	}
	if err := sb.root.WriteFile(p, data, 0o644); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_path", "write: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f handlers) handleGetFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p := r.URL.Query().Get("path")
	if err := checkPath(p); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_path", err.Error())
		return
	}
	fi, err := sb.root.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "workspace_read_not_found", "no such file")
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "invalid_path", err.Error())
		return
	case !fi.Mode().IsRegular():
		writeError(w, http.StatusBadRequest, "invalid_path", "not a regular file")
		return
	}
	data, err := sb.root.ReadFile(p)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_path", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = w.Write(data)
}
