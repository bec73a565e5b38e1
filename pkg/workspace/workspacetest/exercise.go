package workspacetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// Features describes the provider under test.
type Features struct {
	// Dir returns the directory on this machine holding everything of the
	// sandbox with that id (its workspace, home, temporary files), scanned
	// for secrets. Required.
	Dir func(sandboxID string) string
	// WithGitCredentials, if set, returns a provider that holds creds
	// itself (brokered outside the sandbox, like the Cloudflare bridge
	// Worker) and the Dir function of its sandboxes. Nil: the provider of
	// newProvider, with creds given to the worker's workspace.Config.
	WithGitCredentials func(t *testing.T, creds workspace.Credentials) (sandbox.Provider, func(sandboxID string) string)
	// Config, if set, changes every workspace.Config the suite makes (to
	// give it a repository cache, say).
	Config func(t *testing.T, cfg *workspace.Config)
	// Cached says the checkouts come from a repository cache, which gives
	// them the whole history whatever their depth.
	Cached bool
}

type suite struct {
	newProvider func(t *testing.T) sandbox.Provider
	f           Features
}

// Exercise runs the workspace suite against a provider: checkout by ref
// kind, shallow and full; capture of commits, edits, deletions, untracked
// and binary files; the stored diff and bundle; push and rejected push;
// checkout errors; credentials over HTTP that never reach the sandbox.
func Exercise(t *testing.T, newProvider func(t *testing.T) sandbox.Provider, f Features) {
	t.Helper()
	s := &suite{newProvider: newProvider, f: f}
	for name, fn := range map[string]func(*testing.T){
		"CheckoutRefKinds":        s.testCheckoutRefKinds,
		"CheckoutShallowAndFull":  s.testShallowAndFull,
		"CaptureEverything":       s.testCaptureEverything,
		"CaptureNothingChanged":   s.testNothingChanged,
		"PushAndRejectedPush":     s.testPush,
		"CheckoutErrors":          s.testCheckoutErrors,
		"CredentialsNeverVisible": s.testCredentials,
		"JobTokenNeverVisible":    s.testJobToken,
		"CaptureFailures":         s.testCaptureFailures,
		"PutOnlyStore":            s.testPutOnlyStore,
		"ManyFilesTruncated":      s.testManyFiles,
		"BranchMovedBack":         s.testMovedBack,
		"RestoreContinuesTheWork": s.testRestore,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t)
		})
	}
}

var sbSeq atomic.Int64

type bundle struct {
	repo  *Repo
	store *storage.FS
	ws    *workspace.Workspaces
	sb    sandbox.Sandbox
	dir   string // the sandbox's directory on this machine
	ctx   context.Context
}

func (s *suite) setup(t *testing.T, cfg workspace.Config) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	tmp := t.TempDir()
	b := &bundle{ctx: ctx, repo: NewRepo(t, tmp)}
	var err error
	b.store, err = storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	if cfg.Store == nil {
		cfg.Store = b.store
	}
	cfg.AllowFile = cfg.AllowFile || cfg.MaxBytes >= 0
	b.ws, err = s.newWorkspaces(t, cfg)
	require.NoError(t, err)
	b.sb = s.sandbox(t, ctx)
	b.dir = s.f.Dir(b.sb.ID())
	return b
}

func (s *suite) sandbox(t *testing.T, ctx context.Context) sandbox.Sandbox {
	t.Helper()
	sb, err := s.newProvider(t).Create(ctx, sandbox.Spec{ID: "ws-" + strconv.FormatInt(sbSeq.Add(1), 10)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

func spec(repo string, ws protocol.Workspace) workspace.Spec {
	ws.Repo = repo
	return workspace.Spec{Tenant: "acme", ID: "q1", Workspace: ws}
}

// Run runs argv in sb's workspace and returns its stdout, failing on a
// non-zero exit. It is how the tests act as the agent.
func Run(t *testing.T, ctx context.Context, sb sandbox.Sandbox, argv ...string) string {
	t.Helper()
	p, err := sb.Start(ctx, sandbox.ProcSpec{ID: "t-" + strconv.FormatInt(sbSeq.Add(1), 10), Argv: argv,
		Env: map[string]string{"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}})
	require.NoError(t, err)
	out, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	st, err := p.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, "%v: %s", argv, st.StderrTail)
	return strings.TrimSpace(string(out))
}

func (s *suite) testCheckoutRefKinds(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	for _, tc := range []struct {
		name, ref, want, file string
	}{
		{name: "default HEAD", ref: "", want: b.repo.Main, file: "logo.bin"},
		{name: "branch", ref: "feature", want: b.repo.Feature, file: "feature.txt"},
		{name: "tag", ref: "v1", want: b.repo.Tag, file: "del.txt"},
		{name: "commit", ref: b.repo.First, want: b.repo.First, file: "README.md"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := s.sandbox(t, b.ctx)
			base, err := b.ws.Checkout(b.ctx, sb, spec(b.repo.URL, protocol.Workspace{Ref: tc.ref}))
			require.NoError(t, err)
			require.Equal(t, tc.want, base.StartSHA)
			require.Equal(t, "fleet/acme/q1", base.Branch)
			// The agent's working directory is the repository root, on the work branch, clean.
			require.Equal(t, tc.want, Run(t, b.ctx, sb, "git", "rev-parse", "HEAD"))
			require.Equal(t, "fleet/acme/q1", Run(t, b.ctx, sb, "git", "symbolic-ref", "--short", "HEAD"))
			require.Equal(t, "", Run(t, b.ctx, sb, "git", "status", "--porcelain", "--ignored"))
			require.Equal(t, b.repo.URL, Run(t, b.ctx, sb, "git", "remote", "get-url", "origin"))
			_, err = sb.ReadFile(b.ctx, tc.file)
			require.NoError(t, err)
			// Nothing of the fleet's in the checkout: only .git and the repository's files.
			entries, err := os.ReadDir(s.f.Dir(sb.ID()) + "/work")
			if err == nil {
				for _, e := range entries {
					require.NotContains(t, e.Name(), "fleet", "the fleet left %s in the checkout", e.Name())
				}
			}
		})
	}
}

func (s *suite) testShallowAndFull(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	one := 1
	_, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{Depth: &one}))
	require.NoError(t, err)
	if s.f.Cached {
		// The mirror's objects are borrowed whole: depth bounds only what
		// a fetch without the cache transfers.
		require.Equal(t, "false", Run(t, b.ctx, b.sb, "git", "rev-parse", "--is-shallow-repository"))
		require.Equal(t, strconv.Itoa(b.repo.Commits), Run(t, b.ctx, b.sb, "git", "rev-list", "--count", "HEAD"))
	} else {
		require.Equal(t, "true", Run(t, b.ctx, b.sb, "git", "rev-parse", "--is-shallow-repository"))
		require.Equal(t, "1", Run(t, b.ctx, b.sb, "git", "rev-list", "--count", "HEAD"))
	}

	full := s.sandbox(t, b.ctx)
	zero := 0
	_, err = b.ws.Checkout(b.ctx, full, spec(b.repo.URL, protocol.Workspace{Depth: &zero}))
	require.NoError(t, err)
	require.Equal(t, "false", Run(t, b.ctx, full, "git", "rev-parse", "--is-shallow-repository"))
	require.Equal(t, strconv.Itoa(b.repo.Commits), Run(t, b.ctx, full, "git", "rev-list", "--count", "HEAD"))

	def := s.sandbox(t, b.ctx)
	_, err = b.ws.Checkout(b.ctx, def, spec(b.repo.URL, protocol.Workspace{}))
	require.NoError(t, err)
	// depth 50 by default: shallow, but the whole of this short history.
	require.Equal(t, strconv.Itoa(b.repo.Commits), Run(t, b.ctx, def, "git", "rev-list", "--count", "HEAD"))
}

// DoAgentWork makes every kind of change an agent makes in a checkout of
// NewRepo: a commit of its own, then an edit, a deletion, an untracked
// text file, an untracked binary file and an ignored file.
func DoAgentWork(t *testing.T, ctx context.Context, sb sandbox.Sandbox) {
	t.Helper()
	require.NoError(t, sb.WriteFile(ctx, "src/b.go", []byte("package a\n\nfunc B() int { return 2 }\n")))
	Run(t, ctx, sb, "git", "add", "src/b.go")
	Run(t, ctx, sb, "git", "-c", "user.name=Agent", "-c", "user.email=agent@example.invalid", "commit", "-q", "-m", "agent: add B")
	Run(t, ctx, sb, "sh", "-c", "printf 'func C() int { return 3 }\\n' >> src/a.go && sed -i 's/return 1/return 11/' src/a.go && rm del.txt")
	require.NoError(t, sb.WriteFile(ctx, "notes/new.txt", []byte("new\nfile\n")))
	require.NoError(t, sb.WriteFile(ctx, "img/pixel.bin", append([]byte{0, 0}, Binary...)))
	require.NoError(t, sb.WriteFile(ctx, "build/out.o", []byte("ignored")))
}

func (s *suite) testCaptureEverything(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{}))
	require.NoError(t, err)
	DoAgentWork(t, b.ctx, b.sb)
	// The agent gets its prompt on stdin, as the runner gives it; whatever
	// the provider keeps for that (Cloudflare: .fleet/stdin-*) is not work.
	p, err := b.sb.Start(b.ctx, sandbox.ProcSpec{ID: "agent-like", Argv: []string{"cat"}, Stdin: []byte("the prompt")})
	require.NoError(t, err)
	out, err := io.ReadAll(p.Stdout())
	require.NoError(t, err)
	require.Equal(t, "the prompt", string(out))
	_, err = p.Wait(b.ctx)
	require.NoError(t, err)
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	VerifyArtifact(t, b.ctx, b.store, b.repo, art, "acme", "q1")
	require.False(t, art.Pushed)
	require.Equal(t, 5, art.FilesTotal)
	// The extra commit carries the fleet identity; the agent's commit is kept under it.
	require.Equal(t, workspace.CommitName+" <"+workspace.CommitEmail+">",
		Run(t, b.ctx, b.sb, "git", "log", "-1", "--format=%an <%ae>", art.EndSHA))
	require.Equal(t, "agent: add B", Run(t, b.ctx, b.sb, "git", "log", "-1", "--format=%s", art.EndSHA+"^"))
	// The binary file comes back byte for byte.
	require.Equal(t, string(append([]byte{0, 0}, Binary...)), Run(t, b.ctx, b.sb, "git", "cat-file", "blob", art.EndSHA+":img/pixel.bin"))
}

// VerifyArtifact checks a capture of DoAgentWork's changes against real git:
// the manifest matches git diff --numstat, the stored diff applies to
// start_sha and gives end_sha's tree, and the stored bundle verifies on a
// clone at start_sha and brings the branch to end_sha.
func VerifyArtifact(t *testing.T, ctx context.Context, store storage.Store, repo *Repo, art protocol.Artifact, tenant, id string) {
	t.Helper()
	require.Equal(t, repo.Main, art.StartSHA)
	require.NotEqual(t, art.StartSHA, art.EndSHA)
	require.Equal(t, storage.DiffKey(tenant, id), art.DiffKey)
	require.Equal(t, storage.BundleKey(tenant, id), art.BundleKey)
	diff, err := store.Get(ctx, art.DiffKey)
	require.NoError(t, err)
	bundleData, err := store.Get(ctx, art.BundleKey)
	require.NoError(t, err)
	require.Equal(t, int64(len(diff)), art.DiffBytes)
	require.Equal(t, int64(len(bundleData)), art.BundleBytes)

	dir := t.TempDir()
	clone := filepath.Join(dir, "clone")
	Git(t, dir, "clone", "-q", "--no-checkout", repo.URL, clone)
	Git(t, clone, "checkout", "-q", art.StartSHA)
	bundlePath := filepath.Join(dir, "work.bundle")
	require.NoError(t, os.WriteFile(bundlePath, bundleData, 0o644))
	verify, err := GitErr(clone, "bundle", "verify", bundlePath)
	require.NoError(t, err, verify)
	heads := Git(t, clone, "bundle", "list-heads", bundlePath)
	require.Equal(t, art.EndSHA+" refs/heads/"+art.Branch, heads)
	Git(t, clone, "fetch", "-q", bundlePath, "refs/heads/"+art.Branch+":refs/heads/"+art.Branch)
	require.Equal(t, art.EndSHA, Git(t, clone, "rev-parse", art.Branch))

	// The manifest is git diff --numstat.
	numstat := Git(t, clone, "diff", "--numstat", "-M", art.StartSHA, art.EndSHA)
	var lines []string
	for _, f := range art.Files {
		a, d := strconv.Itoa(f.Additions), strconv.Itoa(f.Deletions)
		if f.Binary {
			a, d = "-", "-"
		}
		lines = append(lines, a+"\t"+d+"\t"+f.Path)
	}
	require.Equal(t, numstat, strings.Join(lines, "\n"))
	status := map[string]string{}
	for _, f := range art.Files {
		status[f.Path] = f.Status
	}
	require.Equal(t, map[string]string{
		"src/a.go": protocol.FileModified, "src/b.go": protocol.FileAdded, "del.txt": protocol.FileDeleted,
		"notes/new.txt": protocol.FileAdded, "img/pixel.bin": protocol.FileAdded,
	}, status, "build/out.o is ignored by .gitignore and must not be captured")

	// The stored diff applies to start_sha and yields end_sha's tree.
	applied := filepath.Join(dir, "applied")
	Git(t, dir, "clone", "-q", repo.URL, applied)
	Git(t, applied, "checkout", "-q", art.StartSHA)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "diff.patch"), diff, 0o644))
	Git(t, applied, "apply", "--index", filepath.Join(dir, "diff.patch"))
	require.Equal(t, Git(t, clone, "rev-parse", art.EndSHA+"^{tree}"), Git(t, applied, "write-tree"))
}

func (s *suite) testNothingChanged(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{Ref: "feature"}))
	require.NoError(t, err)
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	require.Equal(t, b.repo.Feature, art.EndSHA)
	require.Equal(t, 0, art.FilesTotal)
	require.NotNil(t, art.Files, `"files":[] on the wire, not null`)
	require.Empty(t, art.Files)
	require.Empty(t, art.BundleKey)
	diff, err := b.store.Get(b.ctx, art.DiffKey)
	require.NoError(t, err)
	require.Empty(t, diff)
}

func (s *suite) testPush(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{Push: true, Branch: "work/one"}))
	require.NoError(t, err)
	DoAgentWork(t, b.ctx, b.sb)
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, Git(t, b.repo.Bare, "rev-parse", "refs/heads/work/one"))

	// A second run pushing to a branch that moved elsewhere is rejected; its work is still stored.
	other := s.sandbox(t, b.ctx)
	base, err = b.ws.Checkout(b.ctx, other, workspace.Spec{Tenant: "acme", ID: "q2",
		Workspace: protocol.Workspace{Repo: b.repo.URL, Ref: "feature", Push: true, Branch: "work/one"}})
	require.NoError(t, err)
	require.NoError(t, other.WriteFile(b.ctx, "x.txt", []byte("x\n")))
	art2, err := b.ws.Capture(b.ctx, other, base)
	require.NoError(t, err)
	require.False(t, art2.Pushed)
	require.Contains(t, art2.PushError, "rejected")
	require.Equal(t, art.EndSHA, Git(t, b.repo.Bare, "rev-parse", "refs/heads/work/one"), "the remote branch is unchanged")
	bundleData, err := b.store.Get(b.ctx, art2.BundleKey)
	require.NoError(t, err)
	require.NotEmpty(t, bundleData)
}

func (s *suite) testCheckoutErrors(t *testing.T) {
	b := s.setup(t, workspace.Config{MaxBytes: 1})
	noLimit, err := s.newWorkspaces(t, workspace.Config{Store: b.store, AllowFile: true})
	require.NoError(t, err)
	noFile, err := s.newWorkspaces(t, workspace.Config{Store: b.store})
	require.NoError(t, err)
	missing := "file://" + filepath.Join(t.TempDir(), "nope.git")
	for _, tc := range []struct {
		name   string
		ws     *workspace.Workspaces
		repo   string
		ref    string
		target error
		in     []string
	}{
		{name: "missing ref", ws: noLimit, repo: b.repo.URL, ref: "no-such-branch", target: workspace.ErrCheckout,
			in: []string{b.repo.URL, "no-such-branch"}},
		{name: "missing commit", ws: noLimit, repo: b.repo.URL, ref: strings.Repeat("ab", 20), target: workspace.ErrCheckout,
			in: []string{strings.Repeat("ab", 20)}},
		{name: "missing repo", ws: noLimit, repo: missing, ref: "main", target: workspace.ErrCheckout, in: []string{missing, "main"}},
		{name: "file not allowed", ws: noFile, repo: b.repo.URL, target: workspace.ErrCheckout, in: []string{"--workspace-allow-file"}},
		{name: "over the size limit", ws: b.ws, repo: b.repo.URL, target: workspace.ErrCheckout, in: []string{"--workspace-max-bytes"}},
		{name: "connection refused", ws: noLimit, repo: "http://127.0.0.1:1/r.git", target: workspace.ErrTransient, in: []string{"127.0.0.1:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.ws.Checkout(b.ctx, s.sandbox(t, b.ctx), spec(tc.repo, protocol.Workspace{Ref: tc.ref}))
			require.ErrorIs(t, err, tc.target)
			var ce *workspace.CheckoutError
			require.True(t, errors.As(err, &ce))
			for _, in := range tc.in {
				require.Contains(t, err.Error(), in)
			}
		})
	}
}

func (s *suite) testCredentials(t *testing.T) {
	const user, token = "fleet-bot", "s3cr3t-T0KEN-9f8e7d"
	tmp := t.TempDir()
	repo := NewRepo(t, tmp)
	srv := Serve(t, tmp, user, token)
	url := srv.URL + "/origin.git"
	store, err := storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	creds, err := workspace.ParseCredentials([]byte("# the fleet's\n" + strings.Replace(srv.URL, "://", "://"+user+":"+token+"@", 1) + "\n"))
	require.NoError(t, err)
	require.NotContains(t, creds.String(), token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Without credentials the server says 401: a checkout error, not a retry.
	anon, err := s.newWorkspaces(t, workspace.Config{Store: store})
	require.NoError(t, err)
	_, err = anon.Checkout(ctx, s.sandbox(t, ctx), spec(url, protocol.Workspace{}))
	require.ErrorIs(t, err, workspace.ErrCheckout)

	ws, err := s.newWorkspaces(t, workspace.Config{Store: store, Credentials: creds})
	require.NoError(t, err)
	sb := s.sandbox(t, ctx)
	dir := s.f.Dir
	if s.f.WithGitCredentials != nil {
		var p sandbox.Provider
		p, dir = s.f.WithGitCredentials(t, creds)
		sb, err = p.Create(ctx, sandbox.Spec{ID: "ws-cred-" + strconv.FormatInt(sbSeq.Add(1), 10)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	}
	base, err := ws.Checkout(ctx, sb, spec(url, protocol.Workspace{Push: true}))
	require.NoError(t, err)
	require.Equal(t, repo.Main, base.StartSHA)

	// What the agent sees while it runs: its environment, its argv, and
	// every file of its sandbox, .git/config included.
	env := Run(t, ctx, sb, "sh", "-c", "env; cat /proc/self/cmdline; cat .git/config; git config --list --show-origin")
	secrets := []string{token, base64.StdEncoding.EncodeToString([]byte(user + ":" + token))}
	for _, sec := range secrets {
		require.NotContains(t, env, sec)
	}
	require.Equal(t, url, Run(t, ctx, sb, "git", "remote", "get-url", "origin"))
	DoAgentWork(t, ctx, sb)
	// A hostile agent sets traps for the git commands that run after it:
	// hooks and an fsmonitor that write their environment into the
	// workspace, and a proxy and URL rewrite that would send the push elsewhere.
	dump := []byte("#!/bin/sh\nenv >> \"$(git rev-parse --show-toplevel 2>/dev/null || pwd)/../leak-$$.txt\"; env >> /tmp/leak-env.txt 2>/dev/null; exit 0\n")
	for _, hook := range []string{"pre-commit", "post-commit", "pre-push", "reference-transaction", "post-checkout"} {
		require.NoError(t, sb.WriteFile(ctx, ".git/hooks/"+hook, dump))
	}
	require.NoError(t, sb.WriteFile(ctx, "dump.sh", dump))
	// A config planted where a fleet repository of a fixed name would be made.
	require.NoError(t, sb.WriteFile(ctx, ".git/fleet-push/config", []byte("[core]\n\tbare = true\n\tsshCommand = ./dump.sh\n[http]\n\tproxy = http://127.0.0.1:1\n")))
	require.NoError(t, sb.WriteFile(ctx, ".git/fleet-push/HEAD", []byte("ref: refs/heads/main\n")))
	Run(t, ctx, sb, "sh", "-c", "chmod +x .git/hooks/* dump.sh && git config core.fsmonitor ./dump.sh && git config http.proxy http://127.0.0.1:1 && git config url.http://127.0.0.1:1/.insteadOf "+srv.URL+"/")
	art, err := ws.Capture(ctx, sb, base)
	require.NoError(t, err)
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/acme/q1"))

	scanTree(t, dir(sb.ID()), secrets)
	for _, key := range []string{art.DiffKey, art.BundleKey} {
		data, err := store.Get(ctx, key)
		require.NoError(t, err)
		for _, sec := range secrets {
			require.False(t, bytes.Contains(data, []byte(sec)), "%s holds the secret", key)
		}
	}
	require.Positive(t, srv.Requests())
}

func (s *suite) testCaptureFailures(t *testing.T) {
	flaky := storagetest.NewFlaky(storagetest.NewMem())
	b := s.setup(t, workspace.Config{Store: flaky})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{}))
	require.NoError(t, err)
	require.NoError(t, b.sb.WriteFile(b.ctx, "x.txt", []byte("x\n")))
	// Storage down: the capture says so.
	flaky.SetDown(true)
	_, err = b.ws.Capture(b.ctx, b.sb, base)
	require.ErrorIs(t, err, storage.ErrUnavailable)
	// Back up, the work is still there to capture.
	flaky.SetDown(false)
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	require.Equal(t, 1, art.FilesTotal)
	// An agent that destroyed the repository: a clear error, no panic.
	Run(t, b.ctx, b.sb, "rm", "-rf", ".git")
	_, err = b.ws.Capture(b.ctx, b.sb, base)
	require.ErrorContains(t, err, "workspace: capture")
}

// putOnly hides every optional ability of a store (streaming, create).
type putOnly struct{ storage.Store }

func (s *suite) testPutOnlyStore(t *testing.T) {
	mem := storagetest.NewMem()
	b := s.setup(t, workspace.Config{Store: putOnly{mem}})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{}))
	require.NoError(t, err)
	DoAgentWork(t, b.ctx, b.sb)
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	VerifyArtifact(t, b.ctx, mem, b.repo, art, "acme", "q1")
}

func (s *suite) testManyFiles(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{}))
	require.NoError(t, err)
	n := protocol.MaxArtifactFiles + 5
	Run(t, b.ctx, b.sb, "sh", "-c", "mkdir many && i=0; while [ $i -lt "+strconv.Itoa(n)+" ]; do echo $i > many/f$i; i=$((i+1)); done")
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	require.Equal(t, n, art.FilesTotal)
	require.Len(t, art.Files, protocol.MaxArtifactFiles)
	require.True(t, art.Truncated)
	require.Equal(t, n, art.Additions, "totals count every file, listed or not")
}

// testMovedBack: an agent that only reset the branch to an older commit;
// the diff reverts to it, and there is no bundle to make (git refuses an
// empty one), which is not an error.
func (s *suite) testMovedBack(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	zero := 0
	base, err := b.ws.Checkout(b.ctx, b.sb, spec(b.repo.URL, protocol.Workspace{Depth: &zero}))
	require.NoError(t, err)
	Run(t, b.ctx, b.sb, "git", "reset", "-q", "--hard", "HEAD~1")
	art, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)
	require.NotEqual(t, art.StartSHA, art.EndSHA)
	require.Equal(t, 1, art.FilesTotal)
	require.Empty(t, art.BundleKey)
	diff, err := b.store.Get(b.ctx, art.DiffKey)
	require.NoError(t, err)
	require.Contains(t, string(diff), "-More words.")
}

// testRestore: a later run of the same query (a resumed session) starts
// where the earlier one left off, even when the remote branch has moved in
// between, and its capture covers the work of both runs.
func (s *suite) testRestore(t *testing.T) {
	b := s.setup(t, workspace.Config{})
	sp := spec(b.repo.URL, protocol.Workspace{Depth: ptrInt(1)})
	nothing, restored, err := b.ws.Restore(b.ctx, b.sb, workspace.Base{Spec: sp})
	require.NoError(t, err)
	require.False(t, restored, "nothing stored yet")
	require.Empty(t, nothing.StartSHA)

	base, err := b.ws.Checkout(b.ctx, b.sb, sp)
	require.NoError(t, err)
	DoAgentWork(t, b.ctx, b.sb)
	first, err := b.ws.Capture(b.ctx, b.sb, base)
	require.NoError(t, err)

	// The remote's main moves on before the next run.
	seed := filepath.Join(filepath.Dir(b.repo.Bare), "seed")
	require.NoError(t, os.WriteFile(filepath.Join(seed, "later.txt"), []byte("later\n"), 0o644))
	Git(t, seed, "add", "-A")
	Git(t, seed, "commit", "-q", "-m", "later")
	Git(t, seed, "push", "-q", b.repo.Bare, "main")

	next := s.sandbox(t, b.ctx)
	base2, err := b.ws.Checkout(b.ctx, next, sp)
	require.NoError(t, err)
	require.NotEqual(t, b.repo.Main, base2.StartSHA)
	base2, restored, err = b.ws.Restore(b.ctx, next, base2)
	require.NoError(t, err)
	require.True(t, restored)
	require.Equal(t, b.repo.Main, base2.StartSHA, "the earlier start is kept")
	require.Equal(t, first.EndSHA, Run(t, b.ctx, next, "git", "rev-parse", "HEAD"))
	got, err := next.ReadFile(b.ctx, "notes/new.txt")
	require.NoError(t, err)
	require.Equal(t, "new\nfile\n", string(got), "the earlier run's untracked file is back")
	_, err = next.ReadFile(b.ctx, "later.txt")
	require.ErrorIs(t, err, sandbox.ErrNotFound, "the work continues from its own start, not the moved branch")

	require.NoError(t, next.WriteFile(b.ctx, "second.txt", []byte("second run\n")))
	art, err := b.ws.Capture(b.ctx, next, base2)
	require.NoError(t, err)
	require.Equal(t, b.repo.Main, art.StartSHA)
	require.Equal(t, first.FilesTotal+1, art.FilesTotal, "the capture covers both runs")
	bundleData, err := b.store.Get(b.ctx, art.BundleKey)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b"), bundleData, 0o644))
	clone := filepath.Join(dir, "c")
	Git(t, dir, "clone", "-q", b.repo.URL, clone)
	Git(t, clone, "checkout", "-q", b.repo.Main)
	Git(t, clone, "bundle", "verify", "-q", filepath.Join(dir, "b"))
}

func ptrInt(v int) *int { return &v }

// scanTree fails if any file under dir contains one of secrets.
func scanTree(t *testing.T, dir string, secrets []string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		for _, sec := range secrets {
			require.False(t, bytes.Contains(data, []byte(sec)), "%s holds a secret", path)
		}
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, files, "nothing scanned under %s", dir)
}
