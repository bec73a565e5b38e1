package bridgefake

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startReq is the body of POST /v1/sb/:id/proc.
type startReq struct {
	ProcID    string            `json:"proc_id"`
	Argv      []string          `json:"argv"`
	Cwd       string            `json:"cwd"`
	Env       map[string]string `json:"env"`
	TimeoutMS int64             `json:"timeout_ms"`
	StdinPath string            `json:"stdin_path"`
	Stdin     string            `json:"stdin"`
}

func (a startReq) same(b startReq) bool {
	return slices.Equal(a.Argv, b.Argv) && a.Cwd == b.Cwd && maps.Equal(a.Env, b.Env) &&
		a.TimeoutMS == b.TimeoutMS && a.StdinPath == b.StdinPath && a.Stdin == b.Stdin
}

// chunk is one read of a process's stdout (fd 1) or stderr (fd 2).
type chunk struct {
	fd   int
	off  int64
	data []byte
}

// proc is a process of a fake sandbox.
type proc struct {
	id     string
	req    startReq
	pid    int
	window int64

	mu      sync.Mutex
	cond    *sync.Cond // on mu: signalled when sent advances or the process exits
	chunks  []chunk
	size    [2]int64      // bytes read per fd
	sent    [2]int64      // highest offset per fd written to any stream
	changed chan struct{} // closed and replaced on every change
	exited  bool          // the leader was reaped; status and code are set
	done    bool          // exited and all output read: streams may send exit
	status  string        // running, completed, failed, killed
	code    int

	reaped chan struct{} // closed once run has finished

	stdin   *stdinState // non-nil for "stdin": "pipe"
	stdinMu sync.Mutex  // serializes stdin writes and close
}

func newProc(req startReq, pid int, window int64) *proc {
	p := &proc{
		id: req.ProcID, req: req, pid: pid, window: window,
		changed: make(chan struct{}), status: "running", reaped: make(chan struct{}),
	}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *proc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *proc) append(fd int, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chunks = append(p.chunks, chunk{fd: fd, off: p.size[fd-1], data: data})
	p.size[fd-1] += int64(len(data))
	p.notify()
}

// waitWindow blocks while more than window bytes of fd are unsent and the
// process runs: output is back-pressured like a pipe to a slow reader.
func (p *proc) waitWindow(fd int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.exited && p.size[fd-1]-p.sent[fd-1] > p.window {
		p.cond.Wait()
	}
}

// markSent records that a stream wrote fd's bytes up to off.
func (p *proc) markSent(reached [2]int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range reached {
		p.sent[i] = max(p.sent[i], r)
	}
	p.cond.Broadcast()
}

// signal signals the process group; it reports whether the process was
// still running.
func (p *proc) signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return false
	}
	return syscall.Kill(-p.pid, sig) == nil
}

// lookPath finds file in the sandbox's PATH (relative entries and names
// with a slash are relative to dir).
func lookPath(file, pathEnv, dir string) (string, error) {
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	isExec := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
	}
	if strings.Contains(file, "/") {
		if p := abs(file); isExec(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s: no such executable", file)
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if p := abs(filepath.Join(cmp.Or(d, "."), file)); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable file not found in $PATH", file)
}

// env builds a process's environment like a fresh container's.
func (f handlers) env(sb *sandbox, req startReq) []string {
	m := map[string]string{
		"PATH":   f.opts.Path,
		"HOME":   filepath.Join(sb.dir, "home"),
		"TMPDIR": filepath.Join(sb.dir, "tmp"),
		"LANG":   "C.UTF-8",
		// The agent's config dir, as the bridge's image sets it.
		"CLAUDE_CONFIG_DIR": filepath.Join(sb.dir, "home", ".claude"),
	}
	maps.Copy(m, f.model.env(sb.id))
	maps.Copy(m, f.opts.BaseEnv)
	maps.Copy(m, sb.env)
	maps.Copy(m, req.Env)
	m[markerEnv] = sb.marker
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// checkStart validates a start request and returns the process's working
// directory, or the error code and message of a 400.
func checkStart(req startReq, sb *sandbox) (dir, code, msg string) {
	switch {
	case !procIDPattern.MatchString(req.ProcID):
		return "", "invalid_request", "proc_id must match [A-Za-z0-9_-]{1,128}"
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return "", "invalid_request", "argv is empty"
	case req.TimeoutMS < 0:
		return "", "invalid_request", "timeout_ms is negative"
	}
	if err := checkEnv(req.Env); err != nil {
		return "", "invalid_request", err.Error()
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return "", "invalid_request", "argv contains NUL"
		}
	}
	dir = sb.ws
	if req.Cwd != "" && req.Cwd != "." {
		if err := checkPath(req.Cwd); err != nil {
			return "", "invalid_path", "cwd: " + err.Error()
		}
		fi, err := sb.root.Stat(req.Cwd)
		if err != nil || !fi.IsDir() {
			return "", "invalid_path", "cwd is not a directory in the workspace"
		}
		dir = filepath.Join(sb.ws, req.Cwd)
	}
	return dir, "", ""
}

// openStdin opens what a start request asks for as the process's stdin: a
// pipe (stdinW is the write end), a workspace file, or nothing. On failure
// it returns the status, error code and message of the answer.
func openStdin(req startReq, sb *sandbox) (stdin, stdinW *os.File, status int, code, msg string) {
	switch {
	case req.Stdin != "" && req.Stdin != "pipe":
		return nil, nil, http.StatusBadRequest, "invalid_stdin", "stdin must be \"pipe\" when given"
	case req.Stdin == "pipe" && req.StdinPath != "":
		return nil, nil, http.StatusBadRequest, "invalid_stdin", "stdin \"pipe\" and stdin_path are mutually exclusive"
	}
	if req.Stdin == "pipe" {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, nil, http.StatusInternalServerError, "internal", err.Error()
		}
		return pr, pw, 0, "", ""
	}
	if req.StdinPath != "" {
		if err := checkPath(req.StdinPath); err != nil {
			return nil, nil, http.StatusBadRequest, "invalid_path", "stdin_path: " + err.Error()
		}
		fh, err := sb.root.Open(req.StdinPath)
		if err != nil {
			return nil, nil, http.StatusBadRequest, "invalid_path", "stdin_path: " + err.Error()
		}
		return fh, nil, 0, "", ""
	}
	return nil, nil, 0, "", ""
}

func (f handlers) handleStart(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req startReq
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "bad body: "+err.Error())
		return
	}
	dir, code, msg := checkStart(req, sb)
	if code != "" {
		writeError(w, http.StatusBadRequest, code, msg)
		return
	}

	f.mu.Lock()
	f.starts[req.ProcID]++
	if old := sb.procs[req.ProcID]; old != nil {
		f.mu.Unlock()
		if !old.req.same(req) {
			writeError(w, http.StatusConflict, "proc_conflict", "proc_id already names a different process")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"proc_id": old.id, "pid": old.pid})
		return
	}
	if f.sandboxes[sb.id] != sb {
		f.mu.Unlock()
		writeError(w, http.StatusNotFound, "sandbox_not_found", "no such sandbox")
		return
	}
	// Held until the process is registered, so that a concurrent start of
	// the same proc_id cannot launch a second one.
	defer f.mu.Unlock()

	stdin, stdinW, status, code, msg := openStdin(req, sb)
	if code != "" {
		writeError(w, status, code, msg)
		return
	}
	if stdin != nil {
		defer stdin.Close()
	}
	env := f.env(sb, req)
	bin, err := lookPath(req.Argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		writeError(w, http.StatusBadRequest, "spawn_failed", err.Error())
		return
	}
	cmd := &exec.Cmd{
		Path:        bin,
		Args:        slices.Clone(req.Argv),
		Env:         env,
		Dir:         dir,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if stdin != nil {
		cmd.Stdin = stdin
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if err := cmd.Start(); err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		writeError(w, http.StatusBadRequest, "spawn_failed", err.Error())
		return
	}
	outW.Close()
	errW.Close()
	p := newProc(req, cmd.Process.Pid, f.opts.OutputWindow)
	if stdinW != nil {
		p.stdin = &stdinState{w: stdinW}
	}
	sb.procs[req.ProcID] = p
	f.launches[req.ProcID]++
	f.envs[sb.id+"/"+req.ProcID] = env
	f.procWG.Add(1)
	go f.run(p, cmd, outR, errR)
	writeJSON(w, http.StatusOK, map[string]any{"proc_id": p.id, "pid": p.pid})
}

func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// run copies the process's output into chunks, reaps it and records how it
// ended. Once the leader has exited, what is left of its process group is
// killed, and output still held open after waitDelay is cut off.
func (f handlers) run(p *proc, cmd *exec.Cmd, outR, errR *os.File) {
	defer f.procWG.Done()
	defer close(p.reaped)
	var timer *time.Timer
	if p.req.TimeoutMS > 0 {
		timer = time.AfterFunc(time.Duration(p.req.TimeoutMS)*time.Millisecond, func() { p.signal(syscall.SIGKILL) })
	}
	var wg sync.WaitGroup
	for fd, rd := range map[int]*os.File{1: outR, 2: errR} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p.waitWindow(fd)
				buf := make([]byte, 32<<10)
				n, err := rd.Read(buf)
				if n > 0 {
					p.append(fd, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	// cmd.Stdout and cmd.Stderr are *os.File, so Wait does not wait for the
	// readers above: the exit is known even while output is pending.
	err := cmd.Wait()
	if timer != nil {
		timer.Stop()
	}
	if p.stdin != nil {
		_ = p.stdin.w.Close() // the FIFO's reader is gone; the file was ours
	}
	status, code := "completed", 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			status, code = "killed", 128+int(ws.Signal())
		} else {
			status, code = "failed", ee.ExitCode()
		}
	default:
		status, code = "failed", -1
	}
	p.mu.Lock()
	p.exited, p.status, p.code = true, status, code
	p.cond.Broadcast()
	p.notify()
	p.mu.Unlock()
	_ = syscall.Kill(-p.pid, syscall.SIGKILL) // grandchildren left in the group

	readers := make(chan struct{})
	go func() {
		wg.Wait()
		close(readers)
	}()
	t := time.NewTimer(waitDelay)
	select {
	case <-readers:
	case <-t.C:
		// Something outside the group (setsid) holds the pipes open.
		_ = outR.Close()
		_ = errR.Close()
		<-readers
	}
	t.Stop()
	_ = outR.Close()
	_ = errR.Close()
	p.mu.Lock()
	p.done = true
	p.notify()
	p.mu.Unlock()
}

// waitDelay bounds how long output is read after the process group is gone.
const waitDelay = 2 * time.Second

// signalNames are the signals /kill accepts.
var signalNames = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "SIGINT": syscall.SIGINT,
	"SIGHUP": syscall.SIGHUP, "SIGQUIT": syscall.SIGQUIT, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

func (f handlers) handleKill(w http.ResponseWriter, r *http.Request, _ *sandbox, p *proc) {
	var req struct {
		Signal string `json:"signal"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "bad body: "+err.Error())
		return
	}
	name := cmp.Or(req.Signal, "SIGTERM")
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig, ok := signalNames[name]
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_request", "unknown signal "+strconv.Quote(req.Signal))
		return
	}
	f.mu.Lock()
	f.kills[p.id] = append(f.kills[p.id], name)
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"killed": p.signal(sig)})
}

func (f handlers) handleStatus(w http.ResponseWriter, _ *http.Request, _ *sandbox, p *proc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	body := map[string]any{"status": p.status}
	if p.exited {
		body["exit_code"] = p.code
	}
	writeJSON(w, http.StatusOK, body)
}

// parseFrom parses "off1,off2" ("" means 0,0).
func parseFrom(s string) ([2]int64, error) {
	var from [2]int64
	if s == "" {
		return from, nil
	}
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return from, errors.New("from must be <stdout offset>,<stderr offset>")
	}
	for i, v := range []string{a, b} {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return from, errors.New("from offsets must be non-negative integers")
		}
		from[i] = n
	}
	return from, nil
}
