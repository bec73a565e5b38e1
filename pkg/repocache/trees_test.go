package repocache_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

func openTrees(t *testing.T, dir string, trees int, maxBytes int64) *repocache.Cache {
	c, err := repocache.Open(repocache.Config{Dir: dir, Trees: trees, MaxBytes: maxBytes, AllowFile: true})
	require.NoError(t, err)
	return c
}

func glob(t *testing.T, pattern string) []string {
	m, err := filepath.Glob(pattern)
	require.NoError(t, err)
	return m
}

func TestATreeIsTakenByOneCallerOnly(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := openTrees(t, filepath.Join(t.TempDir(), "cache"), 1, 0)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	built, err := repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	require.Equal(t, 1, built)

	var wg sync.WaitGroup
	var taken atomic.Int32
	dsts := make([]string, 8)
	for i := range dsts {
		dsts[i] = filepath.Join(c.Dir(), "..", "dst", string(rune('a'+i)))
		require.NoError(t, os.MkdirAll(dsts[i], 0o755))
		wg.Go(func() {
			ok, err := c.TakeTree(repo.URL, repo.Main, dsts[i])
			require.NoError(t, err)
			if ok {
				taken.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), taken.Load())
	full := 0
	for _, d := range dsts {
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		if len(entries) > 0 {
			full++
			require.FileExists(t, filepath.Join(d, "src", "a.go"))
			require.Equal(t, repo.Main, workspacetest.Git(t, d, "rev-parse", "HEAD"))
			require.Empty(t, workspacetest.Git(t, d, "status", "--porcelain"))
			// Its objects are its own: the mirror may go.
			workspacetest.Git(t, d, "fsck", "--no-progress")
		}
	}
	require.Equal(t, 1, full)
	require.Empty(t, glob(t, filepath.Join(c.Dir(), "trees", "*", "*.tree")))
	require.Empty(t, glob(t, filepath.Join(c.Dir(), "taken", "*")), "the claim is removed once moved")

	// No tree of another commit, and none with Trees 0.
	ok, err := c.TakeTree(repo.URL, repo.Feature, t.TempDir())
	require.NoError(t, err)
	require.False(t, ok)
	none := openTrees(t, c.Dir(), 0, 0)
	_, err = repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	ok, err = none.TakeTree(repo.URL, repo.Main, t.TempDir())
	require.NoError(t, err)
	require.False(t, ok)
}

// A worker that stops with a preparation under way cancels it, and
// nothing of it is left.
func TestStopCancelsAPreparationAndRemovesIt(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	events := make(chan repocache.TreeEvent, 4)
	c, err := repocache.Open(repocache.Config{Dir: filepath.Join(t.TempDir(), "cache"), Trees: 1, AllowFile: true,
		Prepared: func(ev repocache.TreeEvent) { events <- ev }})
	require.NoError(t, err)
	building := make(chan string, 1)
	repocache.OnBuild(c, func(ctx context.Context, tmp string) {
		building <- tmp
		<-ctx.Done() // under way until the cache stops
	})
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	c.Prepare(repo.URL, repo.Main) // not running: nothing
	require.NoError(t, c.Start(context.Background()))
	c.Prepare(repo.URL, repo.Main)
	tmp := <-building
	require.NoError(t, c.Stop(context.Background()))
	ev := <-events
	require.ErrorIs(t, ev.Err, context.Canceled)
	require.Equal(t, 0, ev.Built)
	_, err = os.Stat(tmp)
	require.ErrorIs(t, err, os.ErrNotExist)
	left := glob(t, filepath.Join(c.Dir(), "trees", "*", "*"))
	require.Empty(t, left, "no tree, no half-built one, no lock")
	require.Empty(t, events, "one preparation only: the one before Start did nothing")
	c.Prepare(repo.URL, repo.Main) // stopped: nothing
	require.Empty(t, events)
}

// What a worker that died left (a half-built tree, a tree half-taken, a
// lock) is removed when the cache is opened again; what a live worker
// sharing the directory works in, and sealed trees, stay.
func TestOpenRemovesWhatADeadWorkerLeft(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "cache")
	c := openTrees(t, dir, 1, 0)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	_, err := repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	sealed := glob(t, filepath.Join(dir, "trees", "*", "*.tree"))
	require.Len(t, sealed, 1)
	keyDir := filepath.Dir(sealed[0])

	dead := []string{filepath.Join(keyDir, ".tmp-dead"), filepath.Join(dir, "taken", "dead")}
	for _, d := range dead {
		require.NoError(t, os.MkdirAll(filepath.Join(d, "work", "src"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "work", "src", "a.go"), []byte("half"), 0o644))
		require.NoError(t, os.WriteFile(d+".lock", nil, 0o600))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "taken", "orphan.lock"), nil, 0o600))
	live, release, err := repocache.Scratch(keyDir, ".tmp-")
	require.NoError(t, err)
	defer release()
	require.NoError(t, os.MkdirAll(filepath.Join(live, "work"), 0o755))

	openTrees(t, dir, 1, 0)
	for _, d := range dead {
		require.NoDirExists(t, d)
		require.NoFileExists(t, d+".lock")
	}
	require.NoFileExists(t, filepath.Join(dir, "taken", "orphan.lock"))
	require.DirExists(t, filepath.Join(live, "work"), "a live worker's preparation stays")
	require.DirExists(t, sealed[0], "sealed trees stay")
}

// Trees count against MaxBytes with the mirrors, least recently used
// out; a mirror's trees go with it.
func TestTreesCountAgainstTheBound(t *testing.T) {
	t.Parallel()
	a := workspacetest.NewRepo(t, t.TempDir())
	b := workspacetest.NewRepo(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "cache")
	c := openTrees(t, dir, 1, 0)
	for _, r := range []*workspacetest.Repo{a, b} {
		checkout(t, c, r.URL, r.Main, repocache.Auth{})
		_, err := repocache.PrepareNow(ctx(t), c, r.URL, r.Main)
		require.NoError(t, err)
	}
	mirrors := glob(t, filepath.Join(dir, "mirrors", "*.git"))
	require.Len(t, mirrors, 2)
	sizes := repocache.Sizes(c)
	require.Len(t, sizes, 4)
	// Which mirror and tree are b's: b's tree is the newest.
	var treeA, treeB, mirrorA, mirrorB string
	for p := range sizes {
		if strings.HasSuffix(p, ".tree") {
			if treeB == "" || newer(t, p, treeB) {
				treeA, treeB = treeB, p
			} else {
				treeA = p
			}
		}
	}
	for _, m := range mirrors {
		if filepath.Base(m) == filepath.Base(filepath.Dir(treeB))+".git" {
			mirrorB = m
		} else {
			mirrorA = m
		}
	}
	require.NotEmpty(t, mirrorA)
	require.Positive(t, sizes[treeA])
	// Room for all but a's tree: the mirrors alone fit, with the trees
	// they do not.
	bound := sizes[mirrorA] + sizes[mirrorB] + sizes[treeB] + sizes[treeA] - 1
	c2 := openTrees(t, dir, 1, bound)
	_, err := repocache.PrepareNow(ctx(t), c2, b.URL, b.Main)
	require.NoError(t, err)
	require.NoDirExists(t, mirrorA, "a's mirror, the least recently used, went")
	require.NoDirExists(t, treeA, "and a's tree with it")
	require.DirExists(t, mirrorB)
	require.DirExists(t, treeB)
}

func newer(t *testing.T, a, b string) bool {
	fa, err := os.Stat(filepath.Join(a, "fleet-tree"))
	require.NoError(t, err)
	fb, err := os.Stat(filepath.Join(b, "fleet-tree"))
	require.NoError(t, err)
	return fa.ModTime().After(fb.ModTime())
}

// Trees are kept at the commit served last: preparing another commit
// removes the trees of the one before.
func TestStaleTreesGoWhenAnotherCommitIsPrepared(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := openTrees(t, filepath.Join(t.TempDir(), "cache"), 2, 0)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	built, err := repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	require.Equal(t, 2, built)
	built, err = repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	require.Equal(t, 0, built, "there are enough")
	built, err = repocache.PrepareNow(ctx(t), c, repo.URL, repo.Feature)
	require.NoError(t, err)
	require.Equal(t, 2, built)
	trees := glob(t, filepath.Join(c.Dir(), "trees", "*", "*.tree"))
	require.Len(t, trees, 2)
	for _, tr := range trees {
		require.True(t, strings.HasPrefix(filepath.Base(tr), repo.Feature), tr)
	}
}

// A tree is moved, never copied: into a directory of another filesystem
// it is not taken, and stays for a job it can be moved to.
func TestATreeIsNotTakenAcrossFilesystems(t *testing.T) {
	t.Parallel()
	other, err := os.MkdirTemp("/dev/shm", "trees-")
	if err != nil || sameFS(t, other, t.TempDir()) {
		t.Skip("this machine has no second filesystem at /dev/shm")
	}
	defer os.RemoveAll(other)
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := openTrees(t, filepath.Join(t.TempDir(), "cache"), 1, 0)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	_, err = repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	ok, err := c.TakeTree(repo.URL, repo.Main, other)
	require.NoError(t, err)
	require.False(t, ok)
	entries, err := os.ReadDir(other)
	require.NoError(t, err)
	require.Empty(t, entries)
	ok, err = c.TakeTree(repo.URL, repo.Main, t.TempDir())
	require.NoError(t, err)
	require.True(t, ok, "the tree is still there")
}

func sameFS(t *testing.T, a, b string) bool {
	sa, err := os.Stat(a)
	require.NoError(t, err)
	sb, err := os.Stat(b)
	require.NoError(t, err)
	return sa.Sys().(*syscall.Stat_t).Dev == sb.Sys().(*syscall.Stat_t).Dev
}

// A preparation that cannot write (a full disk; here a file where the
// trees go) fails and says so; serving goes on.
func TestAPreparationThatCannotWriteFails(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	events := make(chan repocache.TreeEvent, 4)
	c, err := repocache.Open(repocache.Config{Dir: filepath.Join(t.TempDir(), "cache"), Trees: 1, AllowFile: true,
		Prepared: func(ev repocache.TreeEvent) { events <- ev }})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Stop(context.Background())) }()
	require.NoError(t, os.WriteFile(filepath.Join(c.Dir(), "trees"), []byte("in the way"), 0o600))
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	c.Prepare(repo.URL, repo.Main)
	select {
	case ev := <-events:
		require.Error(t, ev.Err)
		require.Equal(t, 0, ev.Built)
	case <-time.After(time.Minute):
		t.Fatal("the preparation did not end")
	}
	_, hit := checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	require.True(t, hit, "the mirror still serves")
}

// A tree made for a contained agent's uid is its already, but for the
// packs (the mirror's), and its index knows the new ctimes: git has
// nothing to read again when it is taken.
func TestATreeIsGivenToTreeOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root gives files to another uid")
	}
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c, err := repocache.Open(repocache.Config{Dir: filepath.Join(t.TempDir(), "cache"), Trees: 1, TreeOwner: 1000, AllowFile: true})
	require.NoError(t, err)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	_, err = repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	dst := t.TempDir()
	ok, err := c.TakeTree(repo.URL, repo.Main, dst)
	require.NoError(t, err)
	require.True(t, ok)
	packs := filepath.Join(dst, ".git", "objects", "pack") + "/"
	require.NoError(t, filepath.Walk(dst, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dst {
			return err
		}
		want := uint32(1000)
		if strings.HasPrefix(p, packs) {
			want = 0
		}
		require.Equal(t, want, fi.Sys().(*syscall.Stat_t).Uid, p)
		return nil
	}))
	// diff-files compares stat data without refreshing: it lists every
	// file whose ctime the index does not know.
	require.Empty(t, workspacetest.Git(t, dst, "-c", "safe.directory=*", "diff-files", "--name-only", "--", "src"))
}

// A tree without its seal (or whose seal names another commit) is never
// taken, and goes when the repository's next tree is prepared.
func TestAnUnsealedTreeIsNotTaken(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := openTrees(t, filepath.Join(t.TempDir(), "cache"), 1, 0)
	checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
	_, err := repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	trees := glob(t, filepath.Join(c.Dir(), "trees", "*", "*.tree"))
	require.Len(t, trees, 1)
	require.NoError(t, os.Remove(filepath.Join(trees[0], "fleet-tree")))
	ok, err := c.TakeTree(repo.URL, repo.Main, t.TempDir())
	require.NoError(t, err)
	require.False(t, ok)
	built, err := repocache.PrepareNow(ctx(t), c, repo.URL, repo.Main)
	require.NoError(t, err)
	require.Equal(t, 1, built, "the unsealed one does not count")
	require.NoDirExists(t, trees[0])
	ok, err = c.TakeTree(repo.URL, repo.Main, t.TempDir())
	require.NoError(t, err)
	require.True(t, ok)
}
