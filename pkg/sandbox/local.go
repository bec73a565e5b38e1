package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
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

	// Isolation is IsolationNone (a plain child process) or
	// IsolationContained (bubblewrap namespaces, docs/contained.md; NewLocal fails
	// with CheckContained's reason where they cannot be made). Defaults to
	// IsolationNone.
	Isolation string

	// AgentUID is the uid (and gid) of a contained agent, inside and, for a
	// root worker, on the host: what it writes is owned by it. Never 0.
	// Defaults to DefaultAgentUID.
	AgentUID int

	// ReadOnlyPaths are host paths bound read-only at the same place in a
	// contained sandbox, beyond the system's directories and the directory
	// of the program each process runs: an agent's install tree.
	ReadOnlyPaths []string

	// HiddenPaths are host paths a contained agent must never see: the
	// worker's credentials, storage, journal and caches. A program whose
	// directory holds one is bound as the file alone (Root is always
	// treated so), and a ReadOnlyPaths entry holding one is refused.
	HiddenPaths []string

	// TmpBytes bounds each of a contained process's private /tmp and
	// /var/tmp (tmpfs, mode 1777, the agent writes and runs files there).
	// Defaults to 256 MiB.
	TmpBytes int64

	// DefaultLimits fill a ProcSpec's zero Limits; MaxLimits cap them (zero
	// fields: no cap). Contained processes only.
	DefaultLimits, MaxLimits Limits
}

func (c LocalConfig) withDefaults() LocalConfig {
	c.KillGrace = cmp.Or(c.KillGrace, 5*time.Second)
	c.WaitDelay = cmp.Or(c.WaitDelay, 2*time.Second)
	c.Containment = cmp.Or(c.Containment, ContainAuto)
	c.Isolation = cmp.Or(c.Isolation, IsolationNone)
	c.AgentUID = cmp.Or(c.AgentUID, DefaultAgentUID)
	c.TmpBytes = cmp.Or(c.TmpBytes, 256<<20)
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
	if c.Isolation != IsolationNone && c.Isolation != IsolationContained {
		return Invalidf("LocalConfig.Isolation %q must be %q or %q", c.Isolation, IsolationContained, IsolationNone)
	}
	if c.AgentUID <= 0 || c.AgentUID > 1<<31-2 {
		return Invalidf("LocalConfig.AgentUID %d must be a positive uid (never 0)", c.AgentUID)
	}
	if c.TmpBytes < 0 {
		return Invalidf("LocalConfig.TmpBytes must not be negative")
	}
	for i, p := range c.HiddenPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return Invalidf("LocalConfig.HiddenPaths[%d] %q must be a clean absolute path", i, p)
		}
	}
	for i, p := range c.ReadOnlyPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return Invalidf("LocalConfig.ReadOnlyPaths[%d] %q must be a clean absolute path below /", i, p)
		}
		for _, h := range c.HiddenPaths {
			if under(h, p) {
				return Invalidf("LocalConfig.ReadOnlyPaths[%d] %q holds %q, which agents must not see", i, p, h)
			}
		}
	}
	if _, err := c.DefaultLimits.resolve(Limits{}, c.MaxLimits); err != nil {
		return fmt.Errorf("LocalConfig.DefaultLimits: %w", err)
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
	cfg  LocalConfig
	root string // absolute, symlinks resolved
	// hidden are root and HiddenPaths, as given and with symlinks
	// resolved: what a contained sandbox must never show.
	hidden  []string
	log     zerolog.Logger
	contain containment

	mu        sync.Mutex
	sandboxes map[string]*localSandbox // live (not destroyed) sandboxes by ID

	pool *dirPool // recycled sandbox trees and the trash (localpool.go)

	bwrap  string // IsolationContained: bwrap's path
	etcDir string // IsolationContained: the /etc files every sandbox sees
}

// Contained reports whether Local runs processes under IsolationContained.
func (l *Local) Contained() bool { return l.bwrap != "" }

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
		hidden:    hiddenPaths(root, cfg.HiddenPaths),
		pool:      pool,
		cfg:       cfg,
		root:      root,
		log:       cfg.Logger.With().Str("component", "sandbox").Str("provider", "local").Logger(),
		contain:   contain,
		sandboxes: make(map[string]*localSandbox),
	}
	if cfg.Isolation == IsolationContained {
		if err := l.initContained(); err != nil {
			return nil, fmt.Errorf("sandbox: new local provider: %w", err)
		}
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
// the new spec.Env and spec.Network then apply to processes started afterwards.
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
	if s, ok := l.sandboxes[spec.ID]; ok && s.setSpecIfOpen(spec) {
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
		net:       spec.Network,
		limits:    spec.Limits,
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
	if err := ownTree(s); err != nil {
		return nil, fmt.Errorf("sandbox: create %s: give the agent uid its directories: %w", spec.ID, err)
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

// HostConfigDir is the sandbox's CLAUDE_CONFIG_DIR (home/.claude), which
// every process of the sandbox gets whatever its Env says.
func (s *localSandbox) HostConfigDir() string { return s.claudeDir }

// hiddenPaths are root and paths, each also with its symlinks resolved.
func hiddenPaths(root string, paths []string) []string {
	out := []string{root}
	for _, p := range paths {
		out = append(out, p)
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			out = append(out, r)
		}
	}
	return out
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
