package repocache

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/pkg/keyqueue"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// DefaultMaxBytes bounds the mirrors when Config.MaxBytes is 0.
const DefaultMaxBytes = 10 << 30

// Config configures a Cache.
type Config struct {
	// Dir holds the mirrors. Required; created when missing.
	Dir string
	// MaxBytes bounds the mirrors' total size; least recently used
	// mirrors go first. 0 means DefaultMaxBytes.
	MaxBytes int64
	// AllowFile allows file:// remotes (tests, single-machine use).
	AllowFile bool
	// Trees is how many prepared working trees the cache keeps per
	// repository, at the commit it served last (0: none). They are made
	// in the background while the cache runs (Start) and count against
	// MaxBytes.
	Trees int
	// TreeOwner, when positive and the cache runs as root, is the uid
	// (and gid) prepared trees are given to as they are made: a contained
	// agent's (docs/contained.md). The checkout that takes one then has nothing to
	// give the agent, and git nothing to read again (a chown changes
	// every file's ctime, which git checks). Packs stay the cache's.
	TreeOwner int
	// Prepared, when set, is told how each preparation of trees ended
	// (tests and benchmarks wait on it). It is called from the cache's
	// own goroutine and must not block for long.
	Prepared func(TreeEvent)
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Cache is a directory of mirrors and prepared trees. It is safe for
// concurrent use, and several processes may share one directory. Its
// background preparation of trees runs from Start to Stop.
type Cache struct {
	cfg  Config
	log  zerolog.Logger
	prep keyqueue.Queue[treeReq] // the trees' preparation (preparer.go)
	// onBuild, when set, is called as a tree starts being built (tests).
	onBuild func(ctx context.Context, tmp string)
}

// Open returns the cache in cfg.Dir.
func Open(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("repocache: Config.Dir is required")
	}
	if cfg.MaxBytes < 0 {
		return nil, errors.New("repocache: Config.MaxBytes must not be negative")
	}
	if cfg.Trees < 0 {
		return nil, errors.New("repocache: Config.Trees must not be negative")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "mirrors"), 0o700); err != nil {
		return nil, fmt.Errorf("repocache: %w", err)
	}
	c := &Cache{cfg: cfg, log: zerolog.Nop()}
	if cfg.Logger != nil {
		c.log = cfg.Logger.With().Str("component", "repocache").Logger()
	}
	// Trees half-built or half-taken by a worker that stopped (or died)
	// are removed; those a live one works in are left alone.
	c.cleanScratch()
	return c, nil
}

// Auth is the git config entry that authenticates to a remote (an
// http.<url>.extraHeader and its value), or the zero value for none.
type Auth struct{ Key, Value string }

// ErrRefused wraps a remote's refusal of the credentials (or its demand
// for some when none were given).
var ErrRefused = errors.New("repocache: the remote refused the credentials")

// ErrNoRef wraps a ref the remote does not have.
var ErrNoRef = errors.New("repocache: no such ref")

var shaRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// IsSHA reports whether ref is a full commit id.
func IsSHA(ref string) bool { return shaRE.MatchString(ref) }

// LsRemote asks the remote of repo, with auth, which commit ref names:
// the check that the credentials are accepted before the cache serves the
// repository. A full commit id is not resolved (remotes advertise refs,
// not commits): the remote is asked for HEAD, to check the credentials,
// and ref is returned as it is. Errors wrap ErrRefused or ErrNoRef where
// they apply.
func (c *Cache) LsRemote(ctx context.Context, repo, ref string, auth Auth) (string, error) {
	ask := ref
	if ask == "" || IsSHA(ref) {
		ask = "HEAD"
	}
	out, err := c.git(ctx, "", auth, "ls-remote", "--", repo, ask, "refs/heads/"+ask, "refs/tags/"+ask, "refs/tags/"+ask+"^{}")
	if err != nil {
		return "", err
	}
	if IsSHA(ref) {
		return ref, nil
	}
	if sha, ok := parseLsRemote(out, ask); ok {
		return sha, nil
	}
	return "", fmt.Errorf("%w: %s", ErrNoRef, ask)
}

// parseLsRemote picks the commit ask names from ls-remote's output (the
// remote's words: "<sha>\t<ref>" lines), preferring a peeled tag, then a
// branch, then a tag, then the name as given.
func parseLsRemote(out, ask string) (string, bool) {
	found := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		sha, name, ok := strings.Cut(line, "\t")
		if ok {
			found[name] = sha
		}
	}
	for _, name := range []string{"refs/tags/" + ask + "^{}", "refs/heads/" + ask, "refs/tags/" + ask, ask} {
		if sha, ok := found[name]; ok && IsSHA(sha) {
			return sha, true
		}
	}
	return "", false
}

// Link makes sure the mirror of repo holds the commit want, fetching what
// is new with auth, and links the mirror's packs into packDir (a
// checkout's .git/objects/pack). It returns whether the mirror already
// held want (a hit: nothing was fetched). A hit is served under the
// mirror's shared lock; a miss fetches and links under its exclusive one,
// so nothing in between can drop what it links.
func (c *Cache) Link(ctx context.Context, repo, want string, auth Auth, packDir string) (hit bool, err error) {
	if !IsSHA(want) {
		return false, fmt.Errorf("repocache: %q is not a commit id", want)
	}
	m := c.mirror(repo)
	defer c.evict(m.key)
	unlock, err := m.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return false, err
	}
	if packs, verr := m.verified(); verr == nil && c.has(ctx, m, want) {
		err = linkPacks(m.dir, packs, packDir)
		m.touch()
		unlock()
		return err == nil, err
	}
	unlock()

	unlock, err = m.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, err := m.verified(); err != nil {
		if err := m.drop(); err != nil {
			return false, err
		}
	}
	if !c.has(ctx, m, want) { // another may have fetched it while we waited
		if err := c.fetch(ctx, m, repo, want, auth); err != nil {
			return false, err
		}
		if !c.has(ctx, m, want) {
			return false, fmt.Errorf("%w: %s is not in %s after a fetch", ErrNoRef, want, redact(repo))
		}
	}
	packs, err := m.verified()
	if err != nil {
		return false, err
	}
	m.touch()
	return false, linkPacks(m.dir, packs, packDir)
}

// has reports whether m holds the commit want.
func (c *Cache) has(ctx context.Context, m mirror, want string) bool {
	_, err := c.git(ctx, m.dir, Auth{}, "cat-file", "-e", want+"^{commit}")
	return err == nil
}

// fetch brings m up to date with repo's branches and tags, and want if
// they do not hold it. The list of packs is removed first and written
// last: a fetch that dies leaves a mirror without one, which is dropped.
func (c *Cache) fetch(ctx context.Context, m mirror, repo, want string, auth Auth) error {
	if _, err := os.Stat(m.dir); errors.Is(err, os.ErrNotExist) {
		tmp := m.dir + ".new"
		_ = os.RemoveAll(tmp)
		if _, err := c.git(ctx, "", Auth{}, "init", "-q", "--bare", tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, m.dir); err != nil {
			return fmt.Errorf("repocache: %w", err)
		}
	}
	if err := os.Remove(filepath.Join(m.dir, completeFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("repocache: %w", err)
	}
	args := []string{"-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1",
		"fetch", "-q", "--prune", "--no-tags", "--no-recurse-submodules", "--", repo,
		"+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"}
	if _, err := c.git(ctx, m.dir, auth, args...); err != nil {
		return err
	}
	if !c.has(ctx, m, want) {
		// A commit no branch or tag reaches (a pull request's head, say).
		args = []string{"-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1",
			"fetch", "-q", "--no-tags", "--no-recurse-submodules", "--", repo, want}
		if _, err := c.git(ctx, m.dir, auth, args...); err != nil {
			return err
		}
	}
	return m.seal()
}

// git runs git on this machine (not in a sandbox): in dir, with auth given
// to this one process through its environment. It returns stdout; an
// error carries git's stderr and wraps ErrRefused or ErrNoRef where git's
// message says so.
func (c *Cache) git(ctx context.Context, dir string, auth Auth, args ...string) (string, error) {
	argv := append(slices.Clone(hardening), args...)
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Dir = dir
	allow := "http:https:ssh:git"
	if c.cfg.AllowFile {
		allow += ":file"
	}
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + c.cfg.Dir, "LC_ALL=C",
		"GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ALLOW_PROTOCOL=" + allow, "GIT_SSH_COMMAND=ssh -o BatchMode=yes",
	}
	if auth.Key != "" {
		cmd.Env = append(cmd.Env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0="+auth.Key, "GIT_CONFIG_VALUE_0="+auth.Value)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 600 {
			msg = "…" + msg[len(msg)-600:]
		}
		if auth.Value != "" {
			msg = strings.ReplaceAll(msg, auth.Value, "[redacted]")
		}
		verb := args[0]
		for i := 0; verb == "-c" && i+2 < len(args); i += 2 {
			verb = args[i+2]
		}
		err = fmt.Errorf("repocache: git %s: %w: %s", verb, err, msg)
		low := strings.ToLower(msg)
		switch {
		case refused(low):
			return "", fmt.Errorf("%w: %w", ErrRefused, err)
		case strings.Contains(low, "couldn't find remote ref"), strings.Contains(low, "not our ref"),
			strings.Contains(low, "does not appear to be a git repository"), strings.Contains(low, "not found"):
			return "", fmt.Errorf("%w: %w", ErrNoRef, err)
		}
		return "", err
	}
	return stdout.String(), nil
}

func refused(lowerStderr string) bool {
	for _, p := range []string{"authentication failed", "could not read username", "could not read password",
		"terminal prompts disabled", "returned error: 401", "invalid username or password"} {
		if strings.Contains(lowerStderr, p) {
			return true
		}
	}
	return false
}

// hardening comes before every git command of the cache: no hooks, no
// helpers or prompts, no automatic gc (the cache decides when).
var hardening = []string{
	"-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "credential.helper=",
	"-c", "core.askPass=", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
	"-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60",
}

// redact drops a URL's user information, for messages.
func redact(repo string) string {
	if i := strings.Index(repo, "://"); i >= 0 {
		if at := strings.Index(repo[i+3:], "@"); at >= 0 && !strings.Contains(repo[i+3:i+3+at], "/") {
			return repo[:i+3] + repo[i+3+at+1:]
		}
	}
	return repo
}

// key names repo's mirror.
func key(repo string) string {
	h := sha256.Sum256([]byte(repo))
	return hex.EncodeToString(h[:12])
}

// readLines reads name's lines.
func readLines(name string) ([]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Dir is the cache's directory.
func (c *Cache) Dir() string { return c.cfg.Dir }
