package workspace

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Fleet identity of the commit that captures uncommitted work.
const (
	CommitName  = "agentfleet"
	CommitEmail = "fleet@agentfleet.invalid"
)

// Config configures Workspaces.
type Config struct {
	// Store keeps the diff and the bundle. Required.
	Store storage.Store
	// Credentials authenticate fetch and push of http(s) remotes.
	Credentials Credentials
	// AllowFile allows file:// remotes (tests, single-machine use).
	AllowFile bool
	// MaxBytes fails a checkout whose fetched objects are larger (0 = no limit).
	MaxBytes int64
	// Cache, when set, keeps a mirror per repository whose objects
	// checkouts borrow (docs/warm.md), for sandboxes whose working directory is
	// on this machine (sandbox.HostWorkDir). A cache that fails leaves the
	// checkout to fetch from the remote as it would without one.
	Cache *repocache.Cache
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Workspaces checks repositories out into sandboxes and captures the work
// done in them. It is safe for concurrent use.
type Workspaces struct {
	cfg Config
	log zerolog.Logger
}

// New returns Workspaces for cfg.
func New(cfg Config) (*Workspaces, error) {
	if cfg.Store == nil {
		return nil, errors.New("workspace: Config.Store is required")
	}
	if cfg.MaxBytes < 0 {
		return nil, errors.New("workspace: Config.MaxBytes must not be negative")
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = cfg.Logger.With().Str("component", "workspace").Logger()
	}
	return &Workspaces{cfg: cfg, log: log}, nil
}

// Spec is one job's workspace.
type Spec struct {
	Tenant, ID string
	Workspace  protocol.Workspace
}

// Base is a checkout: what Capture compares the work with.
type Base struct {
	Spec     Spec
	StartSHA string
	Branch   string
	// Cache says how the repository cache served the checkout: CacheTree
	// (a prepared working tree), CacheHit (the mirror's objects),
	// CacheMiss (the mirror fetched what was new), or "" with no cache;
	// CacheCold says why the cache could not serve it.
	Cache     string
	CacheCold string
}

// Base.Cache values.
const (
	CacheTree = "tree"
	CacheHit  = "hit"
	CacheMiss = "miss"
	CacheCold = "cold"
)

// Checkout checks spec's repository out at its ref into sb's workspace root,
// which must be empty, on a new branch (spec's branch) at the resolved
// commit, start_sha. The checkout holds the repository and nothing of the
// fleet's; its origin remote is the repository URL, which never carries
// credentials.
//
// With a repository cache (Config.Cache) and a sandbox whose directory is
// on this machine, the job's credentials are put to the remote first; only
// then is a prepared working tree of the commit taken (Base.Cache
// CacheTree) or the mirror's objects linked (CacheHit, CacheMiss).
//
// Credentials for the remote are handed to the one fetch process over its
// stdin and live only in that process's environment while it runs; they are
// never in the agent's environment, argv, files or .git/config.
//
// Errors: a *CheckoutError wrapping ErrCheckout (missing repository or ref,
// refused credentials, file:// not allowed, over MaxBytes) or ErrTransient
// (anything else: retry on another attempt).
func (w *Workspaces) Checkout(ctx context.Context, sb sandbox.Sandbox, spec Spec) (Base, error) {
	ws := spec.Workspace
	fail := func(permanent bool, reason string) (Base, error) {
		return Base{}, &CheckoutError{Repo: ws.Repo, Ref: ws.Ref, Reason: reason, Permanent: permanent}
	}
	if err := protocol.ValidRepo(ws.Repo); err != nil {
		return fail(true, err.Error())
	}
	if strings.HasPrefix(ws.Repo, "file:") && !w.cfg.AllowFile {
		return fail(true, "file:// remotes are not allowed on this worker (--workspace-allow-file)")
	}
	base := Base{Spec: spec, Branch: ws.WorkBranch(spec.Tenant, spec.ID)}
	c, err := w.resolveCached(ctx, sb, spec, &base)
	if err != nil {
		return fail(true, err.Error())
	}
	if c != nil {
		b, done, err := w.fromTree(ctx, sb, spec, c, base)
		if err != nil {
			return fail(false, err.Error())
		}
		if done {
			w.cfg.Cache.Prepare(ws.Repo, c.sha) // the next job's
			return b, nil
		}
	}
	if _, err := w.mustGit(ctx, sb, "init", "init", "-q"); err != nil {
		return fail(false, err.Error())
	}
	// Providers may keep files of their own in the workspace (Cloudflare:
	// .fleet/stdin-*); they are never part of the work.
	if err := sb.WriteFile(ctx, ".git/info/exclude", []byte("/.fleet/\n")); err != nil {
		return fail(false, err.Error())
	}
	if _, err := w.mustGit(ctx, sb, "remote", "remote", "add", "origin", ws.Repo); err != nil {
		return fail(false, err.Error())
	}
	ref := ws.Ref
	if ref == "" {
		ref = "HEAD"
	}
	if c != nil {
		if done, err := w.fromCache(ctx, spec, c, &base); err != nil {
			return fail(true, err.Error())
		} else if done {
			b, err := w.finishCheckout(ctx, sb, base, c.sha, fail)
			if err == nil {
				w.cfg.Cache.Prepare(ws.Repo, c.sha) // the next job's
			}
			return b, err
		}
	}
	args := []string{"fetch", "-q", "--no-tags", "--no-recurse-submodules"}
	if d := ws.CloneDepth(); d > 0 {
		args = append(args, "--depth", strconv.Itoa(d))
	}
	args = append(args, "origin", ref)
	call := gitCall{step: "fetch", args: args, network: true}
	if call.authKey, call.authValue, err = w.auth(sb, ws); err != nil {
		return fail(true, err.Error())
	}
	r, err := w.git(ctx, sb, call)
	if err != nil {
		return fail(false, err.Error())
	}
	if r.code != 0 {
		if authRefused(r.stderr) {
			return fail(true, w.refusal(sb, ws.Repo, call.authKey != "")+" (git fetch: "+lastLines(r.stderr)+")")
		}
		return fail(permanentFetchError(r.stderr), "git fetch: "+lastLines(r.stderr))
	}
	return w.finishCheckout(ctx, sb, base, "FETCH_HEAD", fail)
}

// finishCheckout checks the fetched commit (rev, FETCH_HEAD or a commit
// id) out on the work branch, after the size check.
func (w *Workspaces) finishCheckout(ctx context.Context, sb sandbox.Sandbox, base Base, rev string, fail func(bool, string) (Base, error)) (Base, error) {
	if w.cfg.MaxBytes > 0 {
		size, err := w.objectBytes(ctx, sb)
		if err != nil {
			return fail(false, err.Error())
		}
		if size > w.cfg.MaxBytes {
			return fail(true, fmt.Sprintf("the repository is %d MiB, over this worker's limit of %d MiB (--workspace-max-bytes)",
				(size+1<<20-1)>>20, w.cfg.MaxBytes>>20))
		}
	}
	sha, err := w.mustGit(ctx, sb, "resolve", "rev-parse", "--verify", "-q", rev+"^{commit}")
	if err != nil {
		return fail(true, "the ref does not name a commit")
	}
	if _, err := w.mustGit(ctx, sb, "checkout", "-c", "advice.detachedHead=false", "checkout", "-q", "-B", base.Branch, sha); err != nil {
		return fail(false, err.Error())
	}
	// The unborn branch git init made is gone once we are on base.Branch.
	base.StartSHA = sha
	return base, nil
}

// auth returns the credential to hand to one git process for repo, if any.
// A sandbox whose provider brokers credentials gets none; one that cannot
// take a secret privately gets an error rather than a leak.
//
// A job's own token (ws.Token, which the fleet minted for this repository)
// goes before the worker's credentials, scoped to the repository's host.
func (w *Workspaces) auth(sb sandbox.Sandbox, ws protocol.Workspace) (key, value string, err error) {
	if _, ok := sb.(sandbox.GitCredentialsBrokered); ok {
		return "", "", nil
	}
	key, value, ok := tokenAuth(ws)
	if !ok {
		key, value, ok = w.cfg.Credentials.forRepo(ws.Repo)
	}
	if !ok {
		return "", "", nil
	}
	if _, ok := sb.(sandbox.PrivateStdin); !ok {
		return "", "", errors.New("this sandbox provider cannot take git credentials privately; configure them where the provider keeps them")
	}
	return key, value, nil
}

// objectBytes is the size of the repository's object store.
func (w *Workspaces) objectBytes(ctx context.Context, sb sandbox.Sandbox) (int64, error) {
	out, err := w.mustGit(ctx, sb, "size", "count-objects", "-v")
	if err != nil {
		return 0, err
	}
	var kib int64
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(line, ": ")
		if k == "size" || k == "size-pack" {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			kib += n
		}
	}
	return kib << 10, nil
}

// authRefused tells, by git's message, a remote that refused to let git in
// (no credentials, or refused ones) from other failures.
func authRefused(stderr string) bool {
	s := strings.ToLower(stderr)
	for _, p := range []string{
		"authentication failed", "could not read username", "could not read password",
		"terminal prompts disabled", "returned error: 401", "invalid username or password",
	} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// refusal says, naming the remote's host, that it refused the credentials
// git was given or asked for some the worker has none of. sent tells which.
func (w *Workspaces) refusal(sb sandbox.Sandbox, repo string, sent bool) string {
	host := protocol.RedactRepo(repo)
	if u, err := url.Parse(repo); err == nil && u.Host != "" {
		host = u.Scheme + "://" + u.Host
	}
	if _, brokered := sb.(sandbox.GitCredentialsBrokered); brokered {
		return "the remote " + host + " refused the git credentials the sandbox provider holds for it, or it holds none"
	}
	if sent {
		msg := "the remote " + host + " refused the worker's git credentials for it"
		if _, err := w.cfg.Credentials.current(); err != nil {
			msg += " (the credentials file could not be read again, so the last good ones were used: " + err.Error() + ")"
		}
		return msg
	}
	return "the remote " + host + " asks for credentials and the worker has none for it (--git-credentials)"
}

// permanentFetchError tells a missing repository or ref, or refused
// credentials, from network trouble by git's message.
func permanentFetchError(stderr string) bool {
	s := strings.ToLower(stderr)
	for _, p := range []string{
		"couldn't find remote ref", "not found", "does not appear to be a git repository",
		"authentication failed", "could not read username", "could not read password", "terminal prompts disabled",
		"not our ref", "unadvertised object", "invalid refspec", "access denied", "permission denied",
		"returned error: 401", "returned error: 403", "returned error: 404", "transport 'file' not allowed",
		"unsupported protocol", "is not a valid", "no such remote ref",
	} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// Restore continues the work of an earlier run of the same query in a
// fresh checkout (base, from Checkout): the bundle that run's Capture
// stored is fetched into the repository and the work branch set to its tip,
// so the agent finds every file it left, committed or not. The returned
// Base keeps the earlier run's start_sha (the bundle's prerequisite,
// fetched from the remote when the ref has moved since), so the next
// Capture covers the work of every run. restored is false when no bundle
// is stored (the earlier run changed nothing): base is returned as it is.
func (w *Workspaces) Restore(ctx context.Context, sb sandbox.Sandbox, base Base) (_ Base, restored bool, err error) {
	spec := base.Spec
	data, err := w.cfg.Store.Get(ctx, storage.BundleKey(spec.Tenant, spec.ID))
	if errors.Is(err, storage.ErrNotFound) {
		return base, false, nil
	}
	if err != nil {
		return base, false, fmt.Errorf("workspace: restore: reading the bundle: %w", err)
	}
	start, err := bundlePrerequisite(data)
	if err != nil {
		return base, false, fmt.Errorf("workspace: restore: %w", err)
	}
	if start != base.StartSHA {
		args := []string{"fetch", "-q", "--no-tags"}
		if d := spec.Workspace.CloneDepth(); d > 0 {
			args = append(args, "--depth", strconv.Itoa(d))
		}
		// The job's own URL, not the checkout's "origin": this fetch may
		// run on the worker's side (hostgit.go).
		call := gitCall{step: "fetchstart", args: append(args, spec.Workspace.Repo, start), network: true}
		if call.authKey, call.authValue, err = w.auth(sb, spec.Workspace); err != nil {
			return base, false, fmt.Errorf("workspace: restore: %w", err)
		}
		r, err := w.git(ctx, sb, call)
		if err == nil && r.code != 0 {
			err = fmt.Errorf("git fetch of the earlier start %s: %s", start, lastLines(r.stderr))
		}
		if err != nil {
			return base, false, fmt.Errorf("workspace: restore: %w", err)
		}
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	path := ".git/fleet-restore-" + hex.EncodeToString(rnd[:]) + ".bundle"
	if err := sb.WriteFile(ctx, path, data); err != nil {
		return base, false, fmt.Errorf("workspace: restore: %w", err)
	}
	if _, err := w.mustGit(ctx, sb, "restorefetch", "fetch", "-q", "--no-tags", path, "refs/heads/"+base.Branch); err != nil {
		return base, false, fmt.Errorf("workspace: restore: %w", err)
	}
	if _, err := w.mustGit(ctx, sb, "restorecheckout", "checkout", "-q", "-f", "-B", base.Branch, "FETCH_HEAD"); err != nil {
		return base, false, fmt.Errorf("workspace: restore: %w", err)
	}
	base.StartSHA = start
	return base, true, nil
}

// bundlePrerequisite reads the one prerequisite of a bundle Capture made
// ("-<sha> …" in the v2/v3 header).
func bundlePrerequisite(data []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "# v") || !strings.HasSuffix(sc.Text(), " git bundle") {
		return "", errors.New("the stored bundle has no git bundle header")
	}
	var prereq []string
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		if sha, ok := strings.CutPrefix(line, "-"); ok {
			sha, _, _ = strings.Cut(sha, " ")
			prereq = append(prereq, sha)
		}
	}
	if len(prereq) != 1 || len(prereq[0]) < 40 {
		return "", fmt.Errorf("the stored bundle has %d prerequisites, want its start commit", len(prereq))
	}
	return prereq[0], nil
}
