package workspace_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

const treeUser, treeToken = "fleet-bot", "tree-T0KEN-31"

// treeFixture is a repository served over HTTP with credentials, a
// repository cache that keeps prepared trees (running), and Workspaces
// with the right credentials (ws) and with wrong ones (wrong).
type treeFixture struct {
	repo      *workspacetest.Repo
	url       string
	cache     *repocache.Cache
	events    chan repocache.TreeEvent
	local     *sandbox.Local
	store     storage.Store
	ws, wrong *workspace.Workspaces
	mu        sync.Mutex
	n         int
}

func newTreeFixture(t *testing.T, trees int, isolation string) *treeFixture {
	owner := 0
	if isolation == sandbox.IsolationContained {
		owner = sandbox.DefaultAgentUID // as the worker sets it
	}
	return newOwnedTreeFixture(t, trees, isolation, owner)
}

// newOwnedTreeFixture prepares trees owned by owner (repocache's
// TreeOwner).
func newOwnedTreeFixture(t *testing.T, trees int, isolation string, owner int) *treeFixture {
	tmp := t.TempDir()
	f := &treeFixture{repo: workspacetest.NewRepo(t, tmp), events: make(chan repocache.TreeEvent, 16)}
	srv := workspacetest.Serve(t, tmp, treeUser, treeToken)
	f.url = srv.URL + "/origin.git"
	var err error
	f.cache, err = repocache.Open(repocache.Config{Dir: filepath.Join(tmp, "cache"), Trees: trees, TreeOwner: owner,
		Prepared: func(ev repocache.TreeEvent) { f.events <- ev }})
	require.NoError(t, err)
	require.NoError(t, f.cache.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, f.cache.Stop(context.Background())) })
	f.local, err = sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(tmp, "sandboxes"), Isolation: isolation})
	require.NoError(t, err)
	f.store, err = storage.NewFS(filepath.Join(tmp, "store"))
	require.NoError(t, err)
	f.ws = f.workspaces(t, treeToken)
	f.wrong = f.workspaces(t, "not-the-token")
	return f
}

func (f *treeFixture) workspaces(t *testing.T, token string) *workspace.Workspaces {
	creds, err := workspace.ParseCredentials([]byte(strings.Replace(f.url, "://", "://"+treeUser+":"+token+"@", 1) + "\n"))
	require.NoError(t, err)
	ws, err := workspace.New(workspace.Config{Store: f.store, Credentials: creds, Cache: f.cache})
	require.NoError(t, err)
	return ws
}

// checkout checks the repository's main out with ws into a new sandbox.
func (f *treeFixture) checkout(t *testing.T, ws *workspace.Workspaces) (workspace.Base, sandbox.Sandbox, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	sb, err := f.local.Create(ctx, sandbox.Spec{ID: "tree-" + strconv.Itoa(n)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	base, err := ws.Checkout(ctx, sb, workspace.Spec{Tenant: "acme", ID: "q" + strconv.Itoa(n), Workspace: protocol.Workspace{Repo: f.url}})
	return base, sb, err
}

// prepared waits for the cache's next preparation, which must have made
// a tree.
func (f *treeFixture) prepared(t *testing.T) {
	t.Helper()
	select {
	case ev := <-f.events:
		require.NoError(t, ev.Err)
		require.Equal(t, 1, ev.Built)
		require.Equal(t, f.repo.Main, ev.Commit)
	case <-time.After(time.Minute):
		t.Fatal("no tree was prepared")
	}
}

// trees lists the cache's prepared trees.
func (f *treeFixture) trees(t *testing.T) []string {
	m, err := filepath.Glob(filepath.Join(f.cache.Dir(), "trees", "*", "*.tree"))
	require.NoError(t, err)
	return m
}

func workDir(sb sandbox.Sandbox) string { return sb.(sandbox.HostWorkDir).HostWorkDir() }

// snapshot is what a checkout is: its files' contents (.git aside), HEAD,
// branch, index, origin and excludes.
func snapshot(t *testing.T, sb sandbox.Sandbox) map[string]string {
	t.Helper()
	ctx := context.Background()
	dir := workDir(sb)
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() == ".git" {
			if err == nil {
				return filepath.SkipDir
			}
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			rel, _ := filepath.Rel(dir, p)
			out[rel] = hex.EncodeToString(sum[:])
		}
		return nil
	}))
	out["HEAD"] = workspacetest.Run(t, ctx, sb, "git", "rev-parse", "HEAD")
	out["branch"] = workspacetest.Run(t, ctx, sb, "git", "symbolic-ref", "HEAD")
	out["index"] = workspacetest.Run(t, ctx, sb, "git", "ls-files", "-s")
	out["origin"] = workspacetest.Run(t, ctx, sb, "git", "config", "--get-regexp", "^remote\\.")
	out["status"] = workspacetest.Run(t, ctx, sb, "git", "status", "--porcelain", "--ignored", "--untracked-files=all")
	b, err := os.ReadFile(filepath.Join(dir, ".git", "info", "exclude"))
	require.NoError(t, err)
	out["exclude"] = string(b)
	return out
}

func TestASecondCheckoutTakesAPreparedTree(t *testing.T) {
	t.Parallel()
	f := newTreeFixture(t, 1, sandbox.IsolationNone)
	first, sb1, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	require.Equal(t, workspace.CacheMiss, first.Cache)
	f.prepared(t)
	require.Len(t, f.trees(t), 1)

	second, sb2, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	require.Equal(t, workspace.CacheTree, second.Cache, "served from the prepared tree")
	require.Equal(t, f.repo.Main, second.StartSHA)
	require.Equal(t, "refs/heads/"+second.Branch, workspacetest.Run(t, context.Background(), sb2, "git", "symbolic-ref", "HEAD"))
	// The same checkout a normal one is, but for the branch's name.
	want, got := snapshot(t, sb1), snapshot(t, sb2)
	want["branch"] = strings.Replace(want["branch"], first.Branch, second.Branch, 1)
	require.Equal(t, want, got)
	require.Empty(t, got["status"])
	require.Equal(t, "remote.origin.url "+f.url+"\nremote.origin.fetch +refs/heads/*:refs/remotes/origin/*", got["origin"])
	// Nothing of the credentials anywhere in it.
	scanFiles(t, workDir(sb2), treeToken)

	// The tree was consumed, and the next one prepared for the next job.
	f.prepared(t)
	require.Len(t, f.trees(t), 1)
	// The work in it captures as in any checkout.
	ctx := context.Background()
	workspacetest.DoAgentWork(t, ctx, sb2)
	art, err := f.ws.Capture(ctx, sb2, second)
	require.NoError(t, err)
	workspacetest.VerifyArtifact(t, ctx, f.store, f.repo, art, "acme", second.Spec.ID)
}

func scanFiles(t *testing.T, dir string, secret string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		require.NotContains(t, string(b), secret, p)
		return nil
	}))
}

// Tenant safety: a job whose credentials the remote refuses fails as it
// would without a cache, and the tree is still there for the next job.
func TestAJobWithWrongCredentialsDoesNotGetTheTree(t *testing.T) {
	t.Parallel()
	f := newTreeFixture(t, 1, sandbox.IsolationNone)
	_, _, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	f.prepared(t)

	_, sb, err := f.checkout(t, f.wrong)
	require.ErrorIs(t, err, workspace.ErrCheckout)
	require.ErrorContains(t, err, "refused")
	entries, err := os.ReadDir(workDir(sb))
	require.NoError(t, err)
	require.Empty(t, entries, "nothing of the repository reached the refused job")
	require.Len(t, f.trees(t), 1, "the tree was not taken")

	base, _, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	require.Equal(t, workspace.CacheTree, base.Cache)
}

// A tree that is not what it was prepared as is found after it is moved
// in, dropped and never served; the job checks out from the mirror.
func TestACorruptTreeIsDroppedNotServed(t *testing.T) {
	t.Parallel()
	for name, corrupt := range map[string]func(t *testing.T, work string){
		"truncated file": func(t *testing.T, work string) {
			require.NoError(t, os.Truncate(filepath.Join(work, "src", "a.go"), 3))
		},
		"added file": func(t *testing.T, work string) {
			require.NoError(t, os.WriteFile(filepath.Join(work, "src", "planted.go"), []byte("package a\n"), 0o644))
		},
		"added ignored file": func(t *testing.T, work string) {
			require.NoError(t, os.MkdirAll(filepath.Join(work, "build"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(work, "build", "planted"), []byte("x"), 0o644))
		},
		"no index": func(t *testing.T, work string) {
			require.NoError(t, os.Remove(filepath.Join(work, ".git", "index")))
		},
		"deleted file": func(t *testing.T, work string) {
			require.NoError(t, os.Remove(filepath.Join(work, "README.md")))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newTreeFixture(t, 1, sandbox.IsolationNone)
			_, sb1, err := f.checkout(t, f.ws)
			require.NoError(t, err)
			f.prepared(t)
			trees := f.trees(t)
			require.Len(t, trees, 1)
			corrupt(t, filepath.Join(trees[0], "work"))

			base, sb2, err := f.checkout(t, f.ws)
			require.NoError(t, err)
			require.Equal(t, workspace.CacheHit, base.Cache, "the corrupt tree was not served")
			require.Equal(t, snapshot(t, sb1)["index"], snapshot(t, sb2)["index"])
			require.Empty(t, snapshot(t, sb2)["status"])
			_, err = os.Stat(trees[0])
			require.ErrorIs(t, err, os.ErrNotExist, "the corrupt tree is gone")
			// A good one is prepared for the next job.
			f.prepared(t)
			next, _, err := f.checkout(t, f.ws)
			require.NoError(t, err)
			require.Equal(t, workspace.CacheTree, next.Cache)
		})
	}
}

// Two jobs of one commit and one tree: one takes it, the other checks out
// from the mirror, both get the same checkout.
func TestConcurrentCheckoutsTakeATreeOnce(t *testing.T) {
	t.Parallel()
	f := newTreeFixture(t, 1, sandbox.IsolationNone)
	_, sb1, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	f.prepared(t)
	// No refill from here on: one tree for the two.
	require.NoError(t, f.cache.Stop(context.Background()))

	var wg sync.WaitGroup
	bases := make([]workspace.Base, 2)
	sbs := make([]sandbox.Sandbox, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { bases[i], sbs[i], errs[i] = f.checkout(t, f.ws) })
	}
	wg.Wait()
	var how []string
	want := snapshot(t, sb1)
	for i := range 2 {
		require.NoError(t, errs[i])
		how = append(how, bases[i].Cache)
		got := snapshot(t, sbs[i])
		require.Equal(t, want["index"], got["index"])
		require.Equal(t, want["HEAD"], got["HEAD"])
		require.Empty(t, got["status"])
	}
	require.ElementsMatch(t, []string{workspace.CacheTree, workspace.CacheHit}, how)
	require.Empty(t, f.trees(t))
}

// --repo-cache-trees 0: nothing is prepared; checkouts link the mirror.
func TestNoTreesWithZero(t *testing.T) {
	t.Parallel()
	f := newTreeFixture(t, 0, sandbox.IsolationNone)
	for _, want := range []string{workspace.CacheMiss, workspace.CacheHit, workspace.CacheHit} {
		base, _, err := f.checkout(t, f.ws)
		require.NoError(t, err)
		require.Equal(t, want, base.Cache)
	}
	require.NoError(t, f.cache.Stop(context.Background()))
	require.Empty(t, f.events, "no preparation was even started")
	require.Empty(t, f.trees(t))
}

// In a contained sandbox the agent runs as its own uid: a taken tree ends
// owned as a normal checkout is (the agent's, but for the packs, which
// stay the cache's), and is clean to the agent's git, whether the tree
// was prepared as the agent's (the worker's setting) or is given to it
// when taken (every ctime changes: git reads every file again).
func TestATakenTreeIsTheAgentsWhenContained(t *testing.T) {
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("the worker gives the agent its files only when it runs as root")
	}
	t.Parallel()
	for name, treeOwner := range map[string]int{"prepared as the agent's": sandbox.DefaultAgentUID, "prepared as the worker's": 0} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			takeContained(t, newOwnedTreeFixture(t, 1, sandbox.IsolationContained, treeOwner))
		})
	}
}

// takeContained checks out twice, the second time from the tree, and
// compares the two checkouts' owners.
func takeContained(t *testing.T, f *treeFixture) {
	first, sb1, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	require.Equal(t, workspace.CacheMiss, first.Cache)
	f.prepared(t)
	second, sb2, err := f.checkout(t, f.ws)
	require.NoError(t, err)
	require.Equal(t, workspace.CacheTree, second.Cache)
	require.Equal(t, owners(t, workDir(sb1)), owners(t, workDir(sb2)))
	require.Empty(t, snapshot(t, sb2)["status"])
	ctx := context.Background()
	workspacetest.DoAgentWork(t, ctx, sb2)
	art, err := f.ws.Capture(ctx, sb2, second)
	require.NoError(t, err)
	workspacetest.VerifyArtifact(t, ctx, f.store, f.repo, art, "acme", second.Spec.ID)
	// The mirror's packs are still the worker's: the agent got none.
	packs, err := filepath.Glob(filepath.Join(f.cache.Dir(), "mirrors", "*.git", "objects", "pack", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, packs)
	for _, p := range packs {
		require.Equal(t, 0, owner(t, p), p)
	}
}

// owners says, per kind of file of a checkout, which uids own them.
func owners(t *testing.T, dir string) map[string]map[int]bool {
	out := map[string]map[int]bool{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		kind := "work tree"
		switch rel, _ := filepath.Rel(dir, p); {
		case strings.HasPrefix(rel, filepath.Join(".git", "objects", "pack")+"/"):
			kind = "packs"
		case rel == ".git" || strings.HasPrefix(rel, ".git/"):
			kind = ".git"
		}
		if out[kind] == nil {
			out[kind] = map[int]bool{}
		}
		out[kind][owner(t, p)] = true
		return nil
	}))
	return out
}

func owner(t *testing.T, p string) int {
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// A file with another link (a pack the checkout borrows from the
// repository cache) stays the worker's when a checkout is given to a
// contained agent: giving it would give the agent the cache's copy.
func TestChownLikeLeavesHardLinksAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root (the worker is root when it contains agents)")
	}
	t.Parallel()
	const agentUID = 64123
	cacheDir, work := t.TempDir(), t.TempDir()
	pack := filepath.Join(cacheDir, "pack-1.pack")
	require.NoError(t, os.WriteFile(pack, []byte("objects"), 0o444))
	require.NoError(t, os.MkdirAll(filepath.Join(work, ".git", "objects", "pack"), 0o755))
	require.NoError(t, os.Link(pack, filepath.Join(work, ".git", "objects", "pack", "pack-1.pack")))
	require.NoError(t, os.WriteFile(filepath.Join(work, "README.md"), []byte("# demo\n"), 0o644))
	require.NoError(t, os.Chown(work, agentUID, agentUID))

	require.NoError(t, workspace.ChownLike(work, work))
	require.Equal(t, agentUID, owner(t, filepath.Join(work, "README.md")))
	require.Equal(t, agentUID, owner(t, filepath.Join(work, ".git", "objects", "pack")))
	require.Equal(t, 0, owner(t, filepath.Join(work, ".git", "objects", "pack", "pack-1.pack")))
	require.Equal(t, 0, owner(t, pack), "the cache's copy is still the worker's")
}
