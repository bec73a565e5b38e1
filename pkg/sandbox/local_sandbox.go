package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// localSandbox is one sandbox of Local.
type localSandbox struct {
	l                               *Local
	id                              string
	dir, work, home, claudeDir, tmp string
	log                             zerolog.Logger
	readyAt                         time.Time // when the tree was ready, for the pool

	fileMu sync.RWMutex // held for reading by file operations, for writing to close root
	root   *os.Root     // the workspace; nil once destroyed

	closed atomic.Bool // Destroy was called; set with mu held

	mu         sync.Mutex
	env        map[string]string        // Spec.Env
	net        *Network                 // Spec.Network
	limits     Limits                   // Spec.Limits
	procs      map[string]*localProcess // every process started
	destroyed  bool                     // a Destroy succeeded
	destroying chan struct{}            // closed when the Destroy in progress ends
	destroyErr error                    // result of that Destroy; read after destroying is closed
}

var _ Sandbox = (*localSandbox)(nil)

// ID returns the sandbox ID.
func (s *localSandbox) ID() string { return s.id }

func (s *localSandbox) setSpecIfOpen(spec Spec) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.env = maps.Clone(spec.Env)
	s.net = spec.Network
	s.limits = spec.Limits
	return true
}

// Start validates spec, builds the environment, resolves Argv[0] with the
// child's PATH and starts the process in its own process group.
func (s *localSandbox) Start(ctx context.Context, spec ProcSpec) (Process, error) {
	return s.start(ctx, spec, false)
}

// StartInteractive starts a process whose stdin is a pipe the caller holds
// (the Interactive ability).
func (s *localSandbox) StartInteractive(ctx context.Context, spec ProcSpec) (InteractiveProcess, error) {
	if len(spec.Stdin) > 0 {
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w", spec.ID, s.id, Invalidf("an interactive process takes no ProcSpec.Stdin"))
	}
	p, err := s.start(ctx, spec, true)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s *localSandbox) start(ctx context.Context, spec ProcSpec, interactive bool) (*localProcess, error) {
	op := fmt.Sprintf("sandbox: start process %s in sandbox %s", spec.ID, s.id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := checkID("process ", spec.ID); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, fmt.Errorf("%s: %w", op, Invalidf("Argv is empty"))
	}
	for i, a := range spec.Argv {
		if strings.ContainsRune(a, 0) {
			return nil, fmt.Errorf("%s: %w", op, Invalidf("Argv[%d] holds a NUL byte", i))
		}
	}
	if err := checkEnv(spec.Env); err != nil {
		return nil, fmt.Errorf("%s: ProcSpec.Env: %w", op, err)
	}
	if spec.Network == nil || spec.Limits == (Limits{}) {
		s.mu.Lock()
		if spec.Network == nil {
			spec.Network = s.net
		}
		if spec.Limits == (Limits{}) {
			spec.Limits = s.limits
		}
		s.mu.Unlock()
	}
	if err := spec.Network.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if spec.StderrTailBytes < 0 {
		return nil, fmt.Errorf("%s: %w", op, Invalidf("StderrTailBytes must not be negative"))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if _, dup := s.procs[spec.ID]; dup {
		return nil, fmt.Errorf("%s: %w", op, Invalidf("process ID already used in this sandbox"))
	}
	cwd, err := s.resolveDir(spec.Dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	env, dropped := s.environ(spec.Env, cwd)
	if len(dropped) > 0 {
		// Names only: values may be secrets.
		s.log.Warn().Str("process", spec.ID).Strs("dropped_env", dropped).
			Msg("environment variables on the deny-list were not passed to the process")
	}
	path, err := lookPath(spec.Argv[0], env["PATH"], cwd)
	if err != nil {
		return nil, &SpawnError{Sandbox: s.id, Process: spec.ID, Program: spec.Argv[0], Err: err}
	}
	p, err := s.spawn(spec, path, cwd, env, interactive)
	if err != nil {
		return nil, err
	}
	s.procs[spec.ID] = p
	return p, nil
}

// resolveDir returns the absolute working directory for a ProcSpec.Dir.
func (s *localSandbox) resolveDir(dir string) (string, error) {
	if dir == "" || dir == "." {
		return s.work, nil
	}
	name, err := s.checkPath(dir)
	if err != nil {
		return "", fmt.Errorf("working dir: %w", err)
	}
	s.fileMu.RLock()
	fi, err := s.root.Stat(name)
	s.fileMu.RUnlock()
	switch {
	case err != nil && s.isEscape(err):
		return "", Invalidf("working dir %q escapes the workspace", dir)
	case errors.Is(err, fs.ErrNotExist):
		return "", Invalidf("working dir %q does not exist in the workspace", dir)
	case err != nil:
		return "", fmt.Errorf("working dir %q: %w", dir, err)
	case !fi.IsDir():
		return "", Invalidf("working dir %q is not a directory", dir)
	}
	return filepath.Join(s.work, name), nil
}

// environ builds a process's environment: the base allow-list and
// LocalConfig.EnvAllow read from the worker's environment, then
// LocalConfig.Env, Spec.Env and ProcSpec.Env (later wins), then HOME,
// CLAUDE_CONFIG_DIR, TMPDIR and PWD forced inside the sandbox, and last the
// deny-list, whose dropped names are returned sorted.
func (s *localSandbox) environ(procEnv map[string]string, cwd string) (map[string]string, []string) {
	// Sized once: growing the map took most of this function's time.
	env := make(map[string]string, len(baseEnvAllow)+len(s.l.cfg.EnvAllow)+len(s.l.cfg.Env)+len(s.env)+len(procEnv)+5)
	for _, names := range [][]string{baseEnvAllow, s.l.cfg.EnvAllow} {
		for _, name := range names {
			if v, ok := os.LookupEnv(name); ok {
				env[name] = v
			}
		}
	}
	maps.Copy(env, s.l.cfg.Env)
	maps.Copy(env, s.env)
	maps.Copy(env, procEnv)
	if _, ok := env["PATH"]; !ok {
		env["PATH"] = defaultPATH
	}
	env["HOME"] = s.home
	env["CLAUDE_CONFIG_DIR"] = s.claudeDir
	env["TMPDIR"] = s.tmp
	env["PWD"] = cwd
	var dropped []string
	for name := range env {
		if DeniedEnv(name) {
			delete(env, name)
			dropped = append(dropped, name)
		}
	}
	slices.Sort(dropped)
	return env, dropped
}

// lookPath finds file the way exec.LookPath does, but with the child's PATH
// (pathEnv) instead of the worker's. A name with a slash is taken as a path,
// relative to cwd. Relative PATH entries are ignored.
func lookPath(file, pathEnv, cwd string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w", file, exec.ErrNotFound)
}

// checkExecutable returns nil if p is a regular file with an execute bit.
func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return &fs.PathError{Op: "exec", Path: p, Err: fs.ErrPermission}
	}
	return nil
}

// spawn creates the pipes and starts the process. It is called with s.mu held.
func (s *localSandbox) spawn(spec ProcSpec, path, cwd string, env map[string]string, interactive bool) (*localProcess, error) {
	pp, err := openPipes(len(spec.Stdin) > 0 || interactive)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w: %v", spec.ID, s.id, ErrUnavailable, err)
	}
	var ct *containedStart
	if s.l.Contained() {
		if ct, err = s.prepareContained(spec, path, cwd, env); err != nil {
			pp.closeParent()
			pp.closeChild()
			return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w", spec.ID, s.id, err)
		}
	}
	run, err := s.l.contain.newRun(s.id, spec.ID)
	if err == nil {
		err = applyLimits(run, s.l.cfg, spec.Limits, ct != nil)
	}
	if err != nil {
		pp.closeParent()
		pp.closeChild()
		ct.close()
		if run != nil {
			run.release()
		}
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w", spec.ID, s.id, err)
	}
	newCmd := func() *exec.Cmd {
		if ct != nil {
			cmd := ct.cmd(pp)
			run.prepare(cmd)
			return cmd
		}
		cmd := &exec.Cmd{
			Path:        path,
			Args:        slices.Clone(spec.Argv),
			Env:         envList(env),
			Dir:         cwd,
			Stdout:      pp.stdoutW,
			Stderr:      pp.stderrW,
			SysProcAttr: sysProcAttr(),
		}
		if pp.stdinR != nil {
			cmd.Stdin = pp.stdinR
		}
		run.prepare(cmd)
		return cmd
	}
	cmd := newCmd()
	err = cmd.Start()
	if err != nil && run.startFailed(err) {
		s.log.Debug().Err(err).Msg("starting the process inside its cgroup failed; moving it in after start from now on")
		cmd = newCmd()
		err = cmd.Start()
	}
	pp.closeChild()
	if err != nil {
		pp.closeParent()
		ct.close()
		run.release()
		return nil, &SpawnError{Sandbox: s.id, Process: spec.ID, Program: spec.Argv[0], Err: err}
	}
	err = run.started(cmd.Process.Pid)
	if err == nil && ct != nil {
		err = ct.handshake()
	}
	if err != nil {
		// Uncontained, it could leave processes behind: do not run it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		ct.stop()
		if ct != nil {
			// bwrap's own reason (a bind it could not make) is on stderr.
			_ = pp.stderrR.SetReadDeadline(time.Now().Add(time.Second))
			b, _ := io.ReadAll(io.LimitReader(pp.stderrR, 4<<10))
			if msg := strings.TrimSpace(string(b)); msg != "" {
				err = fmt.Errorf("%w: %s", err, msg)
			}
		}
		pp.closeParent()
		run.release()
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w: %v", spec.ID, s.id, ErrUnavailable, err)
	}
	p := s.newProcess(spec, path, cmd, run, ct, pp, interactive)
	return p, nil
}

// newProcess wraps a started cmd and starts the goroutines that wait for
// it, drain its stderr and feed its stdin.
func (s *localSandbox) newProcess(spec ProcSpec, path string, cmd *exec.Cmd, run containedRun, ct *containedStart, pp *procPipes, interactive bool) *localProcess {
	tailBytes := spec.StderrTailBytes
	if tailBytes == 0 {
		tailBytes = defaultStderrTailBytes
	}
	p := &localProcess{
		id:          spec.ID,
		sandbox:     s.id,
		cmd:         cmd,
		run:         run,
		ct:          ct,
		containMode: s.l.contain.mode(),
		pid:         cmd.Process.Pid,
		waitDelay:   s.l.cfg.WaitDelay,
		stderrR:     pp.stderrR,
		stdinW:      pp.stdinW,
		stderrCopy:  spec.Stderr,
		tail:        &tailBuffer{max: tailBytes},
		done:        make(chan struct{}),
		drained:     make(chan struct{}),
		stdinDone:   make(chan struct{}),
	}
	p.log = s.log.With().Str("process", spec.ID).Int("pid", p.pid).Logger()
	p.stdout = &procStdout{f: pp.stdoutR, p: p}
	p.log.Debug().Str("program", filepath.Base(path)).Msg("process started")

	go p.waitLoop()
	go p.drainStderr()
	if pp.stdinW != nil && !interactive {
		go p.writeStdin(spec.Stdin)
	} else {
		close(p.stdinDone)
	}
	return p
}

// procPipes are the pipes of one process: the parent's ends and the
// child's. stdinR and stdinW are nil when the child's stdin is /dev/null.
type procPipes struct {
	stdoutR, stdoutW, stderrR, stderrW, stdinR, stdinW *os.File
}

// openPipes opens stdout and stderr pipes, and a stdin pipe if withStdin.
func openPipes(withStdin bool) (*procPipes, error) {
	pp := &procPipes{}
	var err error
	if pp.stdoutR, pp.stdoutW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if pp.stderrR, pp.stderrW, err = os.Pipe(); err != nil {
		pp.closeParent()
		pp.closeChild()
		return nil, err
	}
	if withStdin {
		if pp.stdinR, pp.stdinW, err = os.Pipe(); err != nil {
			pp.closeParent()
			pp.closeChild()
			return nil, err
		}
	}
	return pp, nil
}

// closeParent closes the worker's ends.
func (pp *procPipes) closeParent() { closeFiles(pp.stdoutR, pp.stderrR, pp.stdinW) }

// closeChild closes the child's ends (once it has them, or failed to start).
func (pp *procPipes) closeChild() { closeFiles(pp.stdoutW, pp.stderrW, pp.stdinR) }

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}

// envList turns env into a sorted KEY=value list.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
