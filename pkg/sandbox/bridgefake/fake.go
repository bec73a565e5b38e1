package bridgefake

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// MaxFileBytes is the largest file PUT /file accepts (the real bridge's
// 32 MiB RPC payload limit).
const MaxFileBytes = 32 << 20

// DefaultPath is the PATH of fake sandbox processes unless Options.Path is
// set: the usual PATH of a Linux container.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Always makes DropStreamAfter cut every stream connection.
const Always = -1

// ExitMode says how a stream ends once its process has exited.
type ExitMode int

const (
	// ExitNormal sends the exit event, then ends the response.
	ExitNormal ExitMode = iota
	// ExitOmit ends the response without an exit event (every time).
	ExitOmit
	// ExitHang never sends the exit event and keeps the stream open,
	// pinging, until the client goes away.
	ExitHang
	// ExitError sends an error event instead of the exit event.
	ExitError
)

// Options configures a Fake. Every field is optional.
type Options struct {
	// Token is the bearer token. Defaults to a random one (see Fake.Token).
	Token string
	// PingInterval is the interval of ": ping" comments. Defaults to 100ms
	// (the real bridge uses 15s).
	PingInterval time.Duration
	// Path is the PATH of processes. Defaults to DefaultPath.
	Path string
	// BaseEnv is added to every process's base environment.
	BaseEnv map[string]string
	// GitCredentials, if set, are held by the fake like the Worker's
	// GIT_CREDENTIALS secret: processes reach http:// remotes through a
	// loopback egress proxy (http_proxy) that adds them, so git
	// authenticates without ever seeing them.
	GitCredentials workspace.Credentials
	// Dir holds the sandboxes' directories. Defaults to tb.TempDir().
	Dir string
	// OutputWindow is how many bytes of a process's stdout (and, apart,
	// stderr) may be read ahead of what streams have sent before the fake
	// stops reading its pipe, so an unread stream back-pressures the
	// process as a full pipe would. Defaults to 1 MiB.
	OutputWindow int64
}

// Fake is a running fake bridge. Its methods are safe for concurrent use.
type Fake struct {
	opts    Options
	srv     *httptest.Server
	closing chan struct{}
	once    sync.Once
	procWG  sync.WaitGroup

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	// faults
	failCreate       int
	failCreateStatus int
	createDelay      time.Duration
	dropAfter        int64
	dropTimes        int
	dropAbort        bool
	exitMode         ExitMode
	noPings          bool
	failStdin        int
	failStdinAfter   bool

	// counters
	creates, deletes, unauthorized int
	starts, launches, streams      map[string]int
	kills                          map[string][]string
	envs                           map[string][]string // sandbox/proc → env
	stdinWrites                    map[string]int
}

type sandbox struct {
	id    string
	dir   string
	ws    string
	root  *os.Root
	env   map[string]string
	procs map[string]*proc
}

// New starts a fake bridge on a loopback httptest server and registers its
// Close with tb.Cleanup.
func New(tb testing.TB, opts Options) *Fake {
	tb.Helper()
	if opts.Token == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		opts.Token = "bridgefake-" + hex.EncodeToString(b)
	}
	opts.PingInterval = cmp.Or(opts.PingInterval, 100*time.Millisecond)
	opts.Path = cmp.Or(opts.Path, DefaultPath)
	opts.OutputWindow = cmp.Or(opts.OutputWindow, 1<<20)
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	if opts.GitCredentials.Len() > 0 {
		proxy := startGitEgress(tb, opts.GitCredentials)
		env := maps.Clone(opts.BaseEnv)
		if env == nil {
			env = map[string]string{}
		}
		env["http_proxy"] = proxy
		opts.BaseEnv = env
	}
	f := &Fake{
		opts:        opts,
		closing:     make(chan struct{}),
		sandboxes:   map[string]*sandbox{},
		starts:      map[string]int{},
		launches:    map[string]int{},
		streams:     map[string]int{},
		kills:       map[string][]string{},
		stdinWrites: map[string]int{},
		envs:        map[string][]string{},
	}
	f.srv = httptest.NewServer(f.routes())
	tb.Cleanup(f.Close)
	return f
}

// URL is the bridge's base URL.
func (f *Fake) URL() string { return f.srv.URL }

// Token is the bearer token the fake accepts.
func (f *Fake) Token() string { return f.opts.Token }

// Client returns an HTTP client for the fake's server.
func (f *Fake) Client() *http.Client { return f.srv.Client() }

// Close kills every process group, ends open streams, stops the server and
// waits for the fake's goroutines. It is idempotent.
func (f *Fake) Close() {
	f.once.Do(func() {
		close(f.closing)
		f.mu.Lock()
		var all []*sandbox
		for _, sb := range f.sandboxes {
			all = append(all, sb)
		}
		f.sandboxes = map[string]*sandbox{}
		f.mu.Unlock()
		for _, sb := range all {
			f.destroy(sb)
		}
		// Unblock stream handlers stuck writing to clients that stopped
		// reading; Close waits for every handler.
		f.srv.CloseClientConnections()
		f.srv.Close()
		f.procWG.Wait()
	})
}

// FailCreate makes the next n create calls answer 503 CONTAINER_UNAVAILABLE.
func (f *Fake) FailCreate(n int) { f.FailCreateStatus(http.StatusServiceUnavailable, n) }

// FailCreateStatus makes the next n create calls answer status.
func (f *Fake) FailCreateStatus(status, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failCreate, f.failCreateStatus = n, status
}

// DelayCreate makes every create call wait d before answering (a cold start).
func (f *Fake) DelayCreate(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createDelay = d
}

// DropStreamAfter cuts the next `times` stream connections (Always: every
// one) once they have sent n bytes of output (counted per connection, both
// fds); a chunk crossing the limit is split so exactly n bytes go out. The
// connection ends cleanly (EOF without exit) unless SetDropAbort(true).
// times 0 turns dropping off.
func (f *Fake) DropStreamAfter(n int64, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropAfter, f.dropTimes = n, times
}

// SetDropAbort makes dropped streams abort the TCP connection (a read error
// at the client) instead of ending the response cleanly.
func (f *Fake) SetDropAbort(abort bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropAbort = abort
}

// SetExitMode sets how streams end once their process has exited.
func (f *Fake) SetExitMode(m ExitMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exitMode = m
}

// SetPings turns the ": ping" comments on (the default) or off.
func (f *Fake) SetPings(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noPings = !on
}

// Creates is the number of authorized create calls, failed ones included.
func (f *Fake) Creates() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creates
}

// Deletes is the number of DELETE /v1/sb/:id calls.
func (f *Fake) Deletes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deletes
}

// Unauthorized is the number of requests refused for a missing or wrong token.
func (f *Fake) Unauthorized() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unauthorized
}

// Starts is the number of start calls for procID (in any sandbox).
func (f *Fake) Starts(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts[procID]
}

// Launches is the number of processes actually started for procID.
func (f *Fake) Launches(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.launches[procID]
}

// StreamConnects is the number of stream requests for procID.
func (f *Fake) StreamConnects(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams[procID]
}

// Kills lists the signals of the kill calls for procID, in order.
func (f *Fake) Kills(procID string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.kills[procID]...)
}

// ProcEnv is the environment ("NAME=value") process procID of sandboxID was
// started with, or nil.
func (f *Fake) ProcEnv(sandboxID, procID string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.envs[sandboxID+"/"+procID]...)
}

// Workspace is the host directory of sandboxID's workspace, or "" if the
// sandbox does not exist.
func (f *Fake) Workspace(sandboxID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxes[sandboxID]; sb != nil {
		return sb.ws
	}
	return ""
}

// routes builds the handler.
func (f *Fake) routes() http.Handler {
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
	mux.HandleFunc("PUT /v1/sb/{id}/file", f.auth(f.withSandbox(f.handlePutFile)))
	mux.HandleFunc("GET /v1/sb/{id}/file", f.auth(f.withSandbox(f.handleGetFile)))
	mux.HandleFunc("/v1/", f.auth(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route")
	}))
	return mux
}

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
func (f *Fake) auth(h http.HandlerFunc) http.HandlerFunc {
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

func (f *Fake) lookup(id string) *sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id]
}

func (f *Fake) withSandbox(h func(http.ResponseWriter, *http.Request, *sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sb := f.lookup(r.PathValue("id"))
		if sb == nil {
			writeError(w, http.StatusNotFound, "sandbox_not_found", "no such sandbox")
			return
		}
		h(w, r, sb)
	}
}

func (f *Fake) withProc(h func(http.ResponseWriter, *http.Request, *sandbox, *proc)) http.HandlerFunc {
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

func (f *Fake) handleCreate(w http.ResponseWriter, r *http.Request) {
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
		sb = &sandbox{id: id, dir: dir, ws: ws, root: root, procs: map[string]*proc{}}
		f.sandboxes[id] = sb
	}
	sb.env = maps.Clone(req.Env)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "ready": true})
}

func (f *Fake) handleDelete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.deletes++
	sb := f.sandboxes[r.PathValue("id")]
	delete(f.sandboxes, r.PathValue("id"))
	f.mu.Unlock()
	if sb != nil {
		f.destroy(sb)
	}
	w.WriteHeader(http.StatusNoContent)
}

// destroy kills every process group of sb, waits for them and removes its
// directory. sb must already be out of f.sandboxes.
func (f *Fake) destroy(sb *sandbox) {
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

func (f *Fake) handlePutFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
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

func (f *Fake) handleGetFile(w http.ResponseWriter, r *http.Request, sb *sandbox) {
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
