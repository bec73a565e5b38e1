package sandbox

import (
	"cmp"
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
	"golang.org/x/sys/unix"
)

// Names of the directories inside each local sandbox directory Root/<id>.
const (
	localWorkDir   = "work" // the workspace: file paths and ProcSpec.Dir are relative to it
	localHomeDir   = "home" // HOME
	localClaudeDir = "home/.claude"
	localTmpDir    = "tmp" // TMPDIR
)

// baseEnvAllow is copied from the worker's environment into every local
// process when set there. It is kept minimal: locale, time zone, terminal,
// user name and PATH (which is also used to find Argv[0]).
var baseEnvAllow = []string{"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "USER", "LOGNAME"}

// defaultPATH is used when neither the worker nor any Env sets PATH.
const defaultPATH = "/usr/local/bin:/usr/bin:/bin"

// defaultStderrTailBytes is the default for ProcSpec.StderrTailBytes.
const defaultStderrTailBytes = 8 << 10

// LocalConfig configures Local.
type LocalConfig struct {
	// Root is the directory under which each sandbox gets its own directory
	// Root/<id>, holding work/ (the workspace and default working directory),
	// home/ (HOME), home/.claude (CLAUDE_CONFIG_DIR) and tmp/ (TMPDIR).
	// It is created if missing. Required.
	Root string

	// EnvAllow names variables copied from the worker's own environment into
	// every process, in addition to the base allow-list (PATH, LANG, LC_ALL,
	// LC_CTYPE, TZ, TERM, USER, LOGNAME). ANTHROPIC_API_KEY reaches the agent
	// only if it is listed here. Names on the deny-list (see DeniedEnv) are
	// rejected. Defaults to none.
	EnvAllow []string

	// Env holds fixed values the operator sets for every process; Spec.Env
	// and ProcSpec.Env override them. Names on the deny-list are rejected.
	// Defaults to none.
	Env map[string]string

	// Logger receives debug and warning events (never argv, stdin, output or
	// environment values). Defaults to a no-op logger.
	Logger *zerolog.Logger

	// KillGrace is how long Destroy lets a still-running process exit after
	// SIGTERM before it kills the process group. Defaults to 5s.
	KillGrace time.Duration

	// WaitDelay bounds how long, after a process has exited and its process
	// group has been killed, its stdout and stderr may stay open with no data
	// before the sandbox closes them itself. That only happens when some
	// descendant left the group (setsid) and still holds them. Defaults to 2s.
	WaitDelay time.Duration

	// Containment chooses how the processes a run started that left its
	// process group (setsid, double fork) are found and killed when the run
	// ends: ContainCgroup, ContainEnviron, ContainGroup or ContainAuto
	// (cgroup v2 where the worker may create groups, else the environment
	// marker). ContainCgroup fails NewLocal where cgroups cannot be used.
	// See the package documentation. Defaults to ContainAuto.
	Containment string
}

func (c LocalConfig) withDefaults() LocalConfig {
	c.KillGrace = cmp.Or(c.KillGrace, 5*time.Second)
	c.WaitDelay = cmp.Or(c.WaitDelay, 2*time.Second)
	c.Containment = cmp.Or(c.Containment, ContainAuto)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c LocalConfig) validate() error {
	if c.Root == "" {
		return Invalidf("LocalConfig.Root is required")
	}
	if c.KillGrace < 0 {
		return Invalidf("LocalConfig.KillGrace must not be negative")
	}
	if c.WaitDelay < 0 {
		return Invalidf("LocalConfig.WaitDelay must not be negative")
	}
	switch c.Containment {
	case ContainAuto, ContainCgroup, ContainEnviron, ContainGroup:
	default:
		return Invalidf("LocalConfig.Containment %q must be one of %q, %q, %q, %q",
			c.Containment, ContainAuto, ContainCgroup, ContainEnviron, ContainGroup)
	}
	for i, name := range c.EnvAllow {
		if err := checkEnvName(name); err != nil {
			return fmt.Errorf("LocalConfig.EnvAllow[%d]: %w", i, err)
		}
		if DeniedEnv(name) {
			return Invalidf("LocalConfig.EnvAllow[%d] %q is on the deny-list of worker secrets and never reaches a sandbox", i, name)
		}
	}
	if err := checkEnv(c.Env); err != nil {
		return fmt.Errorf("LocalConfig.Env: %w", err)
	}
	for name := range c.Env {
		if DeniedEnv(name) {
			return Invalidf("LocalConfig.Env %q is on the deny-list of worker secrets and never reaches a sandbox", name)
		}
	}
	return nil
}

// Local runs sandboxed processes on this machine: each sandbox is a directory
// and each process a child in its own process group. See the package
// documentation for the environment policy and what Local does not isolate.
type Local struct {
	cfg     LocalConfig
	root    string // absolute, symlinks resolved
	log     zerolog.Logger
	contain containment

	mu        sync.Mutex
	sandboxes map[string]*localSandbox // live (not destroyed) sandboxes by ID

	pool *dirPool // recycled sandbox trees and the trash (localpool.go)
}

var _ Provider = (*Local)(nil)

// NewLocal returns a Local provider. It creates cfg.Root if needed and
// returns an error wrapping ErrInvalid if cfg is invalid.
func NewLocal(cfg LocalConfig) (*Local, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: %w", err)
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: root %q: %w", cfg.Root, err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: %w", err)
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: %w", err)
	}
	contain, why, err := newContainment(cfg.Containment)
	if err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: %w", err)
	}
	pool, err := newDirPool(root)
	if err != nil {
		return nil, fmt.Errorf("sandbox: new local provider: %w", err)
	}
	// Never the worker's model credential: the gateway's (modelcred.go).
	cfg.EnvAllow = slices.DeleteFunc(slices.Clone(cfg.EnvAllow), workerModelCredential)
	cfg.Env = maps.Clone(cfg.Env)
	l := &Local{
		pool:      pool,
		cfg:       cfg,
		root:      root,
		log:       cfg.Logger.With().Str("component", "sandbox").Str("provider", "local").Logger(),
		contain:   contain,
		sandboxes: make(map[string]*localSandbox),
	}
	if why != "" {
		l.log.Info().Str("containment", contain.mode()).Str("cgroup_unavailable", why).
			Msg("processes that leave their process group are found by their environment marker, not by a cgroup")
	} else {
		l.log.Debug().Str("containment", contain.mode()).Msg("process containment")
	}
	return l, nil
}

// Name returns "local".
func (l *Local) Name() string { return "local" }

// Containment returns the containment mode in use (ContainCgroup,
// ContainEnviron or ContainGroup; never ContainAuto).
func (l *Local) Containment() string { return l.contain.mode() }

// Close releases what the provider keeps for later runs once no run is
// left (the cgroups kept for reuse, and their base group, which otherwise
// go after ten idle seconds). Sandboxes still open are not touched; a run
// started afterwards works as before. The worker calls it when it stops.
func (l *Local) Close() error {
	if t, ok := l.contain.(interface{ trim() }); ok {
		t.trim()
	}
	return nil
}

// Create creates the directory Root/<spec.ID> and its subdirectories (by
// renaming a pristine tree from the pool when there is one), or reuses
// them if they exist (a previous attempt's files are kept). Calling
// Create again for a sandbox that is still open returns that same sandbox;
// the new spec.Env then applies to processes started afterwards.
// Errors wrap ErrInvalid (bad ID or Env) or the file system error.
func (l *Local) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: create %s: %w", spec.ID, err)
	}
	if err := checkID("sandbox ", spec.ID); err != nil {
		return nil, fmt.Errorf("sandbox: create: %w", err)
	}
	if err := checkEnv(spec.Env); err != nil {
		return nil, fmt.Errorf("sandbox: create %s: Spec.Env: %w", spec.ID, err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sandboxes[spec.ID]; ok && s.setEnvIfOpen(spec.Env) {
		return s, nil
	}

	dir := filepath.Join(l.root, spec.ID)
	s := &localSandbox{
		l:         l,
		id:        spec.ID,
		dir:       dir,
		work:      filepath.Join(dir, localWorkDir),
		home:      filepath.Join(dir, localHomeDir),
		claudeDir: filepath.Join(dir, localClaudeDir),
		tmp:       filepath.Join(dir, localTmpDir),
		env:       maps.Clone(spec.Env),
		procs:     make(map[string]*localProcess),
		log:       l.log.With().Str("sandbox", spec.ID).Logger(),
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) || !l.pool.take(dir) {
		// Five mkdirs, parents first; MkdirAll (a stat and a mkdir per
		// level) only when one fails, e.g. the ID's tree is already there.
		tree := []string{dir, s.work, s.home, s.claudeDir, s.tmp}
		for _, d := range tree {
			if err := os.Mkdir(d, 0o700); err != nil {
				for _, d := range tree {
					if err := os.MkdirAll(d, 0o700); err != nil {
						return nil, fmt.Errorf("sandbox: create %s: %w", spec.ID, err)
					}
				}
				break
			}
		}
	}
	s.readyAt = time.Now()
	root, err := os.OpenRoot(s.work)
	if err != nil {
		return nil, fmt.Errorf("sandbox: create %s: open workspace: %w", spec.ID, err)
	}
	s.root = root
	l.sandboxes[spec.ID] = s
	s.log.Debug().Msg("sandbox created")
	return s, nil
}

// forget drops s from the live set if it is still the entry for its ID.
func (l *Local) forget(s *localSandbox) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sandboxes[s.id] == s {
		delete(l.sandboxes, s.id)
	}
}

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
	procs      map[string]*localProcess // every process started
	destroyed  bool                     // a Destroy succeeded
	destroying chan struct{}            // closed when the Destroy in progress ends
	destroyErr error                    // result of that Destroy; read after destroying is closed
}

var _ Sandbox = (*localSandbox)(nil)

// ID returns the sandbox ID.
func (s *localSandbox) ID() string { return s.id }

func (s *localSandbox) setEnvIfOpen(env map[string]string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.env = maps.Clone(env)
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
	var parentEnds, childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			_ = f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err != nil {
			closeAll(parentEnds)
			closeAll(childEnds)
			return nil, nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w: %v", spec.ID, s.id, ErrUnavailable, err)
		}
		return r, w, nil
	}
	stdoutR, stdoutW, err := pipe()
	if err != nil {
		return nil, err
	}
	parentEnds, childEnds = append(parentEnds, stdoutR), append(childEnds, stdoutW)
	stderrR, stderrW, err := pipe()
	if err != nil {
		return nil, err
	}
	parentEnds, childEnds = append(parentEnds, stderrR), append(childEnds, stderrW)

	var stdinR, stdinW *os.File
	if len(spec.Stdin) > 0 || interactive {
		if stdinR, stdinW, err = pipe(); err != nil {
			return nil, err
		}
		parentEnds, childEnds = append(parentEnds, stdinW), append(childEnds, stdinR)
	} // else the child's stdin is /dev/null

	run, err := s.l.contain.newRun(s.id, spec.ID)
	if err != nil {
		closeAll(parentEnds)
		closeAll(childEnds)
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w", spec.ID, s.id, err)
	}
	newCmd := func() *exec.Cmd {
		cmd := &exec.Cmd{
			Path:        path,
			Args:        slices.Clone(spec.Argv),
			Env:         envList(env),
			Dir:         cwd,
			Stdout:      stdoutW,
			Stderr:      stderrW,
			SysProcAttr: sysProcAttr(),
		}
		if stdinR != nil {
			cmd.Stdin = stdinR
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
	closeAll(childEnds)
	if err != nil {
		closeAll(parentEnds)
		run.release()
		return nil, &SpawnError{Sandbox: s.id, Process: spec.ID, Program: spec.Argv[0], Err: err}
	}
	if err := run.started(cmd.Process.Pid); err != nil {
		// Uncontained, it could leave processes behind: do not run it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		closeAll(parentEnds)
		run.release()
		return nil, fmt.Errorf("sandbox: start process %s in sandbox %s: %w: %v", spec.ID, s.id, ErrUnavailable, err)
	}

	tailBytes := spec.StderrTailBytes
	if tailBytes == 0 {
		tailBytes = defaultStderrTailBytes
	}
	p := &localProcess{
		id:          spec.ID,
		sandbox:     s.id,
		cmd:         cmd,
		run:         run,
		containMode: s.l.contain.mode(),
		pid:         cmd.Process.Pid,
		waitDelay:   s.l.cfg.WaitDelay,
		stderrR:     stderrR,
		stdinW:      stdinW,
		stderrCopy:  spec.Stderr,
		tail:        &tailBuffer{max: tailBytes},
		done:        make(chan struct{}),
		drained:     make(chan struct{}),
		stdinDone:   make(chan struct{}),
	}
	p.log = s.log.With().Str("process", spec.ID).Int("pid", p.pid).Logger()
	p.stdout = &procStdout{f: stdoutR, p: p}
	p.log.Debug().Str("program", filepath.Base(path)).Msg("process started")

	go p.waitLoop()
	go p.drainStderr()
	if stdinW != nil && !interactive {
		go p.writeStdin(spec.Stdin)
	} else {
		close(p.stdinDone)
	}
	return p, nil
}

// envList turns env into a sorted KEY=value list.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// checkPath validates a workspace-relative path lexically and returns it
// cleaned. Absolute paths and ".." escapes give ErrInvalid; symlink escapes
// are caught by os.Root when the path is used.
func (s *localSandbox) checkPath(path string) (string, error) {
	if strings.ContainsRune(path, 0) {
		return "", Invalidf("path %q holds a NUL byte", path)
	}
	if filepath.IsAbs(path) || !filepath.IsLocal(path) {
		return "", Invalidf("path %q is not a relative path inside the workspace", path)
	}
	return filepath.Clean(path), nil
}

// errPathEscapes is the (unexported) error os.Root returns for a path that
// leaves the root, learnt once by asking a Root for an absolute path.
var errPathEscapes = sync.OnceValue(func() error {
	r, err := os.OpenRoot("/")
	if err != nil {
		return nil
	}
	defer func() { _ = r.Close() }()
	_, err = r.Stat("/")
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
})

// isEscape reports whether err says that a path left the workspace (through
// a symlink) or met a symlink loop.
func (s *localSandbox) isEscape(err error) bool {
	if esc := errPathEscapes(); esc != nil && errors.Is(err, esc) {
		return true
	}
	return errors.Is(err, syscall.ELOOP) || strings.Contains(err.Error(), "path escapes from parent")
}

// fileErr maps an error from a workspace file operation to the sentinels.
func (s *localSandbox) fileErr(op, path string, err error) error {
	prefix := fmt.Sprintf("sandbox: %s %q in sandbox %s", op, path, s.id)
	switch {
	case s.isEscape(err):
		return fmt.Errorf("%s: %w", prefix, Invalidf("path escapes the workspace"))
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", prefix, ErrNotFound)
	case errors.Is(err, os.ErrClosed):
		return fmt.Errorf("%s: %w", prefix, ErrClosed)
	default:
		return fmt.Errorf("%s: %w", prefix, err)
	}
}

// fileOp runs fn on the workspace root unless the sandbox is closed.
func (s *localSandbox) fileOp(ctx context.Context, op, path string, fn func(name string) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: %s %q in sandbox %s: %w", op, path, s.id, err)
	}
	name, err := s.checkPath(path)
	if err != nil {
		return fmt.Errorf("sandbox: %s in sandbox %s: %w", op, s.id, err)
	}
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	if s.closed.Load() || s.root == nil {
		return fmt.Errorf("sandbox: %s %q in sandbox %s: %w", op, path, s.id, ErrClosed)
	}
	if err := fn(name); err != nil {
		return s.fileErr(op, path, err)
	}
	return nil
}

// WriteFile writes data to path (relative to the workspace), creating parent
// directories. Absolute paths, ".." and symlinks leading out of the workspace
// give ErrInvalid.
func (s *localSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	return s.fileOp(ctx, "write file", path, func(name string) error {
		if dir := filepath.Dir(name); dir != "." {
			if err := s.root.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		return s.root.WriteFile(name, data, 0o644)
	})
}

// ReadFile reads path (relative to the workspace): ErrNotFound if absent,
// ErrInvalid if it escapes the workspace.
func (s *localSandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var data []byte
	err := s.fileOp(ctx, "read file", path, func(name string) error {
		var err error
		data, err = s.root.ReadFile(name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Destroy stops every process (SIGTERM, KillGrace, then SIGKILL to each
// group), waits for them, and removes the sandbox directory. It is
// idempotent; a failed Destroy (ctx done, directory not removable) can be
// retried. After Destroy, Start, WriteFile and ReadFile return ErrClosed.
func (s *localSandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.destroying != nil {
		ch := s.destroying
		s.mu.Unlock()
		select {
		case <-ch:
			return s.destroyErr
		case <-ctx.Done():
			return fmt.Errorf("sandbox: destroy %s: %w", s.id, ctx.Err())
		}
	}
	if s.destroyed {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	ch := make(chan struct{})
	s.destroying = ch
	procs := slices.Collect(maps.Values(s.procs))
	s.mu.Unlock()

	s.l.forget(s)
	err := s.destroy(ctx, procs)

	s.mu.Lock()
	s.destroyErr = err
	s.destroyed = err == nil
	s.destroying = nil // a later call retries after a failure, or returns nil
	s.mu.Unlock()
	close(ch)
	return err
}

func (s *localSandbox) destroy(ctx context.Context, procs []*localProcess) error {
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Go(func() { errs[i] = p.shutdown(ctx, s.l.cfg.KillGrace) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: destroy %s: %w", s.id, err)
	}
	s.fileMu.Lock()
	if s.root != nil {
		_ = s.root.Close()
		s.root = nil
	}
	s.fileMu.Unlock()
	// Every process is gone: the tree is recycled when nothing was
	// written to it, else removed with the next batch (localpool.go).
	if err := s.l.pool.put(s.dir, s.readyAt); err != nil {
		if err := removeAll(s.dir); err != nil {
			return fmt.Errorf("sandbox: destroy %s: %w", s.id, err)
		}
	}
	s.log.Debug().Msg("sandbox destroyed")
	return nil
}

// removeAll removes dir. If that fails it makes every directory under dir
// writable and tries again: agents leave read-only trees behind (Go's module
// cache, for one). Symlinks are never followed.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// localProcess is a child process of a localSandbox.
type localProcess struct {
	id, sandbox string
	cmd         *exec.Cmd
	run         containedRun // what else the process started, however detached
	containMode string
	pid         int // also the process group ID
	log         zerolog.Logger
	waitDelay   time.Duration

	stdout     *procStdout
	stderrR    *os.File
	stderrCopy io.Writer
	tail       *tailBuffer
	stdinW     *os.File // nil when ProcSpec.Stdin was empty
	stdinOnce  sync.Once

	// mu orders signals against the leader's reaping: signals go to the group
	// only while exited is false, and exited is set before the leader is
	// reaped, so its PID (the group ID) cannot have been reused.
	mu     sync.Mutex
	exited bool

	leaderGone atomic.Bool // set once exited and the group was killed; readers then bound their waits
	status     ExitStatus  // written before done is closed
	statusErr  error       // written before done is closed

	done      chan struct{} // closed once the leader is reaped
	drained   chan struct{} // closed once stderr is drained
	stdinDone chan struct{} // closed once the stdin writer is done
}

var (
	_ Process            = (*localProcess)(nil)
	_ InteractiveProcess = (*localProcess)(nil)
	_ Interactive        = (*localSandbox)(nil)
)

// Stdin is the stdin pipe of an interactive process.
func (p *localProcess) Stdin() io.WriteCloser { return localStdin{p} }

type localStdin struct{ p *localProcess }

func (w localStdin) Write(b []byte) (int, error) {
	if w.p.stdinW == nil {
		return 0, fmt.Errorf("sandbox: process %s has no stdin: %w", w.p.id, ErrInvalid)
	}
	n, err := w.p.stdinW.Write(b)
	if err != nil {
		select {
		case <-w.p.done:
			return n, fmt.Errorf("sandbox: write stdin of process %s: %w", w.p.id, ErrExited)
		default:
		}
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return n, fmt.Errorf("sandbox: write stdin of process %s: %w: %v", w.p.id, ErrExited, err)
		}
		return n, fmt.Errorf("sandbox: write stdin of process %s: %w", w.p.id, err)
	}
	return n, nil
}

func (w localStdin) Close() error {
	w.p.closeStdin()
	return nil
}

// ID returns the process ID given in ProcSpec.
func (p *localProcess) ID() string { return p.id }

// Stdout returns the process's stdout. It reaches io.EOF once every holder
// of the pipe has closed it, or WaitDelay after the process exited if some
// process that left the group keeps it open without writing.
func (p *localProcess) Stdout() io.Reader { return p.stdout }

// waitLoop waits for the leader to exit, kills what remains of its process
// group, reaps it and records the exit status.
func (p *localProcess) waitLoop() {
	defer close(p.done)
	var werr error
	if err := waitExitedNoReap(p.pid); err == nil {
		p.markExited() // leader is a zombie: the group ID is still ours
		werr = p.cmd.Wait()
	} else {
		werr = p.cmd.Wait()
		p.markExited()
	}
	// The group is dead; now whatever left it (setsid, double fork).
	if n, err := p.run.killAll(); err != nil {
		p.log.Error().Err(err).Msg("processes the run started are still alive")
	} else if n > 0 {
		p.log.Info().Int("processes", n).Str("containment", p.containMode).
			Msg("killed processes the run left behind outside its process group")
	}
	p.run.release()
	p.leaderGone.Store(true)
	deadline := time.Now().Add(p.waitDelay)
	_ = p.stdout.f.SetReadDeadline(deadline)
	_ = p.stderrR.SetReadDeadline(deadline)
	p.closeStdin()

	ps := p.cmd.ProcessState
	if ps == nil {
		p.statusErr = fmt.Errorf("sandbox: wait process %s in sandbox %s: %w: %v", p.id, p.sandbox, ErrUnavailable, werr)
		return
	}
	p.status = exitStatus(ps)
	p.log.Debug().Int("code", p.status.Code).Str("signal", p.status.Signal).Msg("process exited")
}

// markExited records that the leader exited and SIGKILLs the rest of its
// group, so no descendant outlives the run.
func (p *localProcess) markExited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exited = true
	_ = syscall.Kill(-p.pid, syscall.SIGKILL) // ESRCH when the group is empty
}

// signalGroup sends sig to the process group; false if the leader had exited.
func (p *localProcess) signalGroup(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return false
	}
	_ = syscall.Kill(-p.pid, sig)
	return true
}

func exitStatus(ps *os.ProcessState) ExitStatus {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("SIG%d", int(ws.Signal()))
		}
		return ExitStatus{Code: -1, Signal: name}
	}
	return ExitStatus{Code: ps.ExitCode()}
}

// drainStderr reads stderr until EOF (or WaitDelay of silence after the
// leader exited) so the child never blocks on a full stderr pipe.
func (p *localProcess) drainStderr() {
	defer close(p.drained)
	defer func() { _ = p.stderrR.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := p.readBounded(p.stderrR, buf)
		if n > 0 {
			_, _ = p.tail.Write(buf[:n])
			if p.stderrCopy != nil {
				_, _ = p.stderrCopy.Write(buf[:n])
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				p.log.Warn().Msg("stderr still open after the process exited (a descendant left its process group); closed it")
			}
			return
		}
	}
}

// readBounded reads from one of the process's output pipes. Before the
// leader exits it blocks like any read. Afterwards each read waits at most
// WaitDelay for new data and returns os.ErrDeadlineExceeded when none came,
// which means a process outside the group holds the pipe open. Data already
// in the pipe is always returned, however late the read.
func (p *localProcess) readBounded(f *os.File, b []byte) (int, error) {
	if p.leaderGone.Load() {
		_ = f.SetReadDeadline(time.Now().Add(p.waitDelay))
	}
	n, err := f.Read(b)
	for errors.Is(err, os.ErrDeadlineExceeded) && pendingBytes(f) > 0 {
		// The deadline passed before the read looked at the pipe (a slow
		// reader, or a tiny WaitDelay); the data is there, so this read
		// does not block.
		_ = f.SetReadDeadline(time.Time{})
		n, err = f.Read(b)
	}
	return n, err
}

// writeStdin writes data to stdin and closes it. A child that exits (or
// closes stdin) without reading it gives EPIPE or ErrClosed, both ignored.
func (p *localProcess) writeStdin(data []byte) {
	defer close(p.stdinDone)
	_, err := p.stdinW.Write(data)
	p.closeStdin()
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, os.ErrClosed) {
		p.log.Debug().Err(err).Msg("writing stdin failed")
	}
}

func (p *localProcess) closeStdin() {
	if p.stdinW == nil {
		return
	}
	p.stdinOnce.Do(func() { _ = p.stdinW.Close() })
}

// Wait waits for the process to exit and for its stderr to be drained.
func (p *localProcess) Wait(ctx context.Context) (ExitStatus, error) {
	for _, ch := range []chan struct{}{p.done, p.drained} {
		select {
		case <-ch:
		case <-ctx.Done():
			return ExitStatus{}, fmt.Errorf("sandbox: wait process %s in sandbox %s: %w", p.id, p.sandbox, ctx.Err())
		}
	}
	if p.statusErr != nil {
		return ExitStatus{}, p.statusErr
	}
	st := p.status
	st.StderrTail = p.tail.String()
	return st, nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the leader
// to exit, then sends SIGKILL. With grace <= 0 it sends SIGKILL at once. If
// ctx ends first the group is killed and ctx's error returned. It returns
// ErrExited if the process had already exited.
func (p *localProcess) Stop(ctx context.Context, grace time.Duration) error {
	op := fmt.Sprintf("sandbox: stop process %s in sandbox %s", p.id, p.sandbox)
	sig := syscall.SIGKILL
	if grace > 0 {
		sig = syscall.SIGTERM
	}
	if !p.signalGroup(sig) {
		return fmt.Errorf("%s: %w", op, ErrExited)
	}
	p.log.Debug().Str("signal", unix.SignalName(sig)).Msg("stopping process")
	if sig == syscall.SIGTERM {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return nil
		case <-timer.C:
			p.log.Debug().Msg("grace period over; killing process group")
			p.signalGroup(syscall.SIGKILL)
		case <-ctx.Done():
			p.signalGroup(syscall.SIGKILL)
			return fmt.Errorf("%s: %w", op, ctx.Err())
		}
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// shutdown stops the process if needed, waits for its goroutines, and
// closes its stdout. Used by Destroy.
func (p *localProcess) shutdown(ctx context.Context, grace time.Duration) error {
	if err := p.Stop(ctx, grace); err != nil && !errors.Is(err, ErrExited) {
		return err
	}
	for _, ch := range []chan struct{}{p.done, p.drained, p.stdinDone} {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sandbox: stop process %s in sandbox %s: %w", p.id, p.sandbox, ctx.Err())
		}
	}
	p.stdout.close()
	return nil
}

// procStdout is the caller's view of stdout. Once the leader has exited,
// each Read may wait at most WaitDelay for data, so a pipe held open by an
// escaped descendant cannot hang the caller.
type procStdout struct {
	f      *os.File
	p      *localProcess
	eof    atomic.Bool
	closed sync.Once
}

// Read implements io.Reader.
func (s *procStdout) Read(b []byte) (int, error) {
	if s.eof.Load() {
		return 0, io.EOF
	}
	n, err := s.p.readBounded(s.f, b)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, io.EOF):
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.p.log.Warn().Msg("stdout still open after the process exited (a descendant left its process group); closed it")
	case errors.Is(err, os.ErrClosed):
		return n, fmt.Errorf("sandbox: read stdout of process %s in sandbox %s: %w", s.p.id, s.p.sandbox, ErrClosed)
	default:
		return n, fmt.Errorf("sandbox: read stdout of process %s in sandbox %s: %w", s.p.id, s.p.sandbox, err)
	}
	s.eof.Store(true)
	s.close()
	return n, io.EOF
}

func (s *procStdout) close() { s.closed.Do(func() { _ = s.f.Close() }) }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
}

// Write implements io.Writer; it never fails.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		t.truncated = t.truncated || len(p) > t.max || len(t.buf) > 0
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.truncated = true
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept bytes. When older bytes were dropped, a partial
// UTF-8 sequence at the start is trimmed.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if t.truncated {
		for i := 0; i < 3 && len(b) > 0 && b[0]&0xC0 == 0x80; i++ {
			b = b[1:]
		}
	}
	return string(b)
}

// HostConfigDir is the sandbox's CLAUDE_CONFIG_DIR (home/.claude), which
// every process of the sandbox gets whatever its Env says.
func (s *localSandbox) HostConfigDir() string { return s.claudeDir }
