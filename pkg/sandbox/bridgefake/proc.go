package bridgefake

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
func (f *Fake) env(sb *sandbox, req startReq) []string {
	m := map[string]string{
		"PATH":   f.opts.Path,
		"HOME":   filepath.Join(sb.dir, "home"),
		"TMPDIR": filepath.Join(sb.dir, "tmp"),
		"LANG":   "C.UTF-8",
		// The agent's config dir, as the bridge's image sets it.
		"CLAUDE_CONFIG_DIR": filepath.Join(sb.dir, "home", ".claude"),
	}
	maps.Copy(m, f.opts.BaseEnv)
	maps.Copy(m, sb.env)
	maps.Copy(m, req.Env)
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (f *Fake) handleStart(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req startReq
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "bad body: "+err.Error())
		return
	}
	switch {
	case !procIDPattern.MatchString(req.ProcID):
		writeError(w, http.StatusBadRequest, "invalid_request", "proc_id must match [A-Za-z0-9_-]{1,128}")
		return
	case len(req.Argv) == 0 || req.Argv[0] == "":
		writeError(w, http.StatusBadRequest, "invalid_request", "argv is empty")
		return
	case req.TimeoutMS < 0:
		writeError(w, http.StatusBadRequest, "invalid_request", "timeout_ms is negative")
		return
	}
	if err := checkEnv(req.Env); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			writeError(w, http.StatusBadRequest, "invalid_request", "argv contains NUL")
			return
		}
	}
	dir := sb.ws
	if req.Cwd != "" && req.Cwd != "." {
		if err := checkPath(req.Cwd); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_path", "cwd: "+err.Error())
			return
		}
		fi, err := sb.root.Stat(req.Cwd)
		if err != nil || !fi.IsDir() {
			writeError(w, http.StatusBadRequest, "invalid_path", "cwd is not a directory in the workspace")
			return
		}
		dir = filepath.Join(sb.ws, req.Cwd)
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

	var stdin *os.File
	switch {
	case req.Stdin != "" && req.Stdin != "pipe":
		writeError(w, http.StatusBadRequest, "invalid_stdin", "stdin must be \"pipe\" when given")
		return
	case req.Stdin == "pipe" && req.StdinPath != "":
		writeError(w, http.StatusBadRequest, "invalid_stdin", "stdin \"pipe\" and stdin_path are mutually exclusive")
		return
	}
	var stdinW *os.File
	if req.Stdin == "pipe" {
		pr, pw, err := os.Pipe()
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		defer pr.Close()
		stdin, stdinW = pr, pw
	}
	if req.StdinPath != "" {
		if err := checkPath(req.StdinPath); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_path", "stdin_path: "+err.Error())
			return
		}
		fh, err := sb.root.Open(req.StdinPath)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_path", "stdin_path: "+err.Error())
			return
		}
		defer fh.Close()
		stdin = fh
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
func (f *Fake) run(p *proc, cmd *exec.Cmd, outR, errR *os.File) {
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

func (f *Fake) handleKill(w http.ResponseWriter, r *http.Request, _ *sandbox, p *proc) {
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

func (f *Fake) handleStatus(w http.ResponseWriter, _ *http.Request, _ *sandbox, p *proc) {
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

// streamFaults is the fault configuration a stream connection starts with.
type streamFaults struct {
	dropArmed bool
	dropAfter int64
	abort     bool
}

// takeDrop consumes one stream drop; it reports whether this connection
// should be cut now.
func (f *Fake) takeDrop() bool {
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

func (f *Fake) handleStream(w http.ResponseWriter, r *http.Request, _ *sandbox, p *proc) {
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
			f.mu.Lock()
			mode := f.exitMode
			f.mu.Unlock()
			switch mode {
			case ExitNormal:
				writeEvent(w, "exit", map[string]any{"code": code, "status": status})
				fl.Flush()
				return
			case ExitOmit:
				fl.Flush()
				return
			case ExitError:
				writeEvent(w, "error", map[string]string{"code": "exec_transport_error", "message": "injected stream error"})
				fl.Flush()
				return
			case ExitHang:
				changed = nil // nothing more will happen; ping until the client leaves
			}
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

func writeOut(w io.Writer, fd int, off int64, data []byte) {
	writeEvent(w, "out", map[string]any{"fd": fd, "off": off, "b64": base64.StdEncoding.EncodeToString(data)})
}

func writeEvent(w io.Writer, name string, v any) {
	b, _ := json.Marshal(v)
	_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
}
