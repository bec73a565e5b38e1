package repocache_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, maxBytes int64) *repocache.Cache {
	c, err := repocache.Open(repocache.Config{Dir: filepath.Join(t.TempDir(), "cache"), MaxBytes: maxBytes, AllowFile: true})
	require.NoError(t, err)
	return c
}

// checkout makes an empty repository, links the cache's objects into it and
// checks want out there: what a workspace does in its sandbox.
func checkout(t *testing.T, c *repocache.Cache, repo, want string, auth repocache.Auth) (dir string, hit bool) {
	t.Helper()
	dir = t.TempDir()
	workspacetest.Git(t, dir, "init", "-q")
	hit, err := c.Link(ctx(t), repo, want, auth, filepath.Join(dir, ".git", "objects", "pack"))
	require.NoError(t, err)
	workspacetest.Git(t, dir, "checkout", "-q", want)
	return dir, hit
}

func TestASecondCheckoutFetchesNothingAndBorrowsTheObjects(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := open(t, 0)
	sha, err := c.LsRemote(ctx(t), repo.URL, "main", repocache.Auth{})
	require.NoError(t, err)
	require.Equal(t, repo.Main, sha)

	dir, hit := checkout(t, c, repo.URL, sha, repocache.Auth{})
	require.False(t, hit, "the first checkout fills the mirror")
	require.FileExists(t, filepath.Join(dir, "src", "a.go"))
	_, hit = checkout(t, c, repo.URL, sha, repocache.Auth{})
	require.True(t, hit, "the second is served from the mirror")

	// New work on the remote: the mirror fetches only what is new.
	seed := filepath.Join(filepath.Dir(repo.Bare), "seed")
	workspacetest.Git(t, seed, "checkout", "-q", "main")
	require.NoError(t, os.WriteFile(filepath.Join(seed, "new.txt"), []byte("new\n"), 0o644))
	workspacetest.Git(t, seed, "add", "-A")
	workspacetest.Git(t, seed, "commit", "-q", "-m", "fifth")
	workspacetest.Git(t, seed, "push", "-q", repo.Bare, "main")
	next, err := c.LsRemote(ctx(t), repo.URL, "main", repocache.Auth{})
	require.NoError(t, err)
	require.NotEqual(t, sha, next)
	dir, hit = checkout(t, c, repo.URL, next, repocache.Auth{})
	require.False(t, hit)
	require.FileExists(t, filepath.Join(dir, "new.txt"))
	packs, err := filepath.Glob(filepath.Join(dir, ".git", "objects", "pack", "*.pack"))
	require.NoError(t, err)
	require.Len(t, packs, 2, "the first fetch's pack and the increment's")

	// A checkout's objects are its own once linked: dropping the mirror
	// (eviction) does not break it.
	require.NoError(t, os.RemoveAll(filepath.Join(c.Dir(), "mirrors")))
	workspacetest.Git(t, dir, "fsck", "--connectivity-only", "--no-progress")
}

func TestRefsAndCommitsResolve(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	c := open(t, 0)
	for ref, want := range map[string]string{"v1": repo.Tag, "feature": repo.Feature, "": repo.Main, repo.First: repo.First} {
		got, err := c.LsRemote(ctx(t), repo.URL, ref, repocache.Auth{})
		require.NoError(t, err, ref)
		require.Equal(t, want, got, ref)
		checkout(t, c, repo.URL, got, repocache.Auth{})
	}
	_, err := c.LsRemote(ctx(t), repo.URL, "no-such-branch", repocache.Auth{})
	require.ErrorIs(t, err, repocache.ErrNoRef)
}

// A job is served from the mirror only once its own credentials pass the
// remote: ls-remote with refused ones fails even though the mirror holds
// the repository.
func TestCredentialsAreCheckedBeforeTheCacheServes(t *testing.T) {
	t.Parallel()
	const user, token = "fleet-bot", "cache-T0KEN-77"
	tmp := t.TempDir()
	workspacetest.NewRepo(t, tmp)
	srv := workspacetest.Serve(t, tmp, user, token)
	url := srv.URL + "/origin.git"
	header := func(tok string) repocache.Auth {
		return repocache.Auth{Key: "http." + srv.URL + "/.extraHeader",
			Value: "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+tok))}
	}
	c := open(t, 0)
	sha, err := c.LsRemote(ctx(t), url, "main", header(token))
	require.NoError(t, err)
	checkout(t, c, url, sha, header(token))

	_, err = c.LsRemote(ctx(t), url, "main", header("wrong"))
	require.ErrorIs(t, err, repocache.ErrRefused)
	require.NotContains(t, err.Error(), base64.StdEncoding.EncodeToString([]byte(user+":wrong")))
	_, err = c.LsRemote(ctx(t), url, "main", repocache.Auth{})
	require.ErrorIs(t, err, repocache.ErrRefused)
	// Nothing of the credentials is in the mirror's files.
	scan(t, c.Dir(), token, base64.StdEncoding.EncodeToString([]byte(user+":"+token)))
}

func scan(t *testing.T, dir string, secrets ...string) {
	t.Helper()
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, s := range secrets {
			require.NotContains(t, string(b), s, p)
		}
		return nil
	}))
}

// A truncated pack or a fetch that died half-way is found, dropped and
// fetched again, never served.
func TestACorruptMirrorIsDroppedAndRebuilt(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	for name, corrupt := range map[string]func(t *testing.T, mirror string){
		"truncated pack": func(t *testing.T, mirror string) {
			packs, _ := filepath.Glob(filepath.Join(mirror, "objects", "pack", "*.pack"))
			require.NotEmpty(t, packs)
			require.NoError(t, os.Truncate(packs[0], 100))
		},
		"unsealed": func(t *testing.T, mirror string) {
			require.NoError(t, os.Remove(filepath.Join(mirror, "fleet-complete")))
		},
		"stray pack": func(t *testing.T, mirror string) {
			require.NoError(t, os.WriteFile(filepath.Join(mirror, "objects", "pack", "pack-0000.pack"), []byte("junk"), 0o444))
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := open(t, 0)
			checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
			mirrors, _ := filepath.Glob(filepath.Join(c.Dir(), "mirrors", "*.git"))
			require.Len(t, mirrors, 1)
			corrupt(t, mirrors[0])
			dir, hit := checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
			require.False(t, hit, "a corrupt mirror is not a hit")
			workspacetest.Git(t, dir, "fsck", "--no-progress")
		})
	}
}

func TestConcurrentCheckoutsOfOneRepository(t *testing.T) {
	t.Parallel()
	repo := workspacetest.NewRepo(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "cache")
	var wg sync.WaitGroup
	hits := make(chan bool, 8)
	for range 8 {
		// Half the checkouts through a second Cache on the same directory,
		// as a second worker process (or a restarted one) would.
		c, err := repocache.Open(repocache.Config{Dir: dir, AllowFile: true})
		require.NoError(t, err)
		wg.Go(func() {
			d, hit := checkout(t, c, repo.URL, repo.Main, repocache.Auth{})
			workspacetest.Git(t, d, "fsck", "--no-progress")
			hits <- hit
		})
	}
	wg.Wait()
	close(hits)
	misses := 0
	for h := range hits {
		if !h {
			misses++
		}
	}
	require.Equal(t, 1, misses, "one fetch filled the mirror; the others waited for it")
}

func TestLeastRecentlyUsedMirrorsGoFirst(t *testing.T) {
	t.Parallel()
	a := workspacetest.NewRepo(t, t.TempDir())
	b := workspacetest.NewRepo(t, t.TempDir())
	c := open(t, 1) // any two mirrors are over the bound
	checkout(t, c, a.URL, a.Main, repocache.Auth{})
	checkout(t, c, b.URL, b.Main, repocache.Auth{})
	mirrors, _ := filepath.Glob(filepath.Join(c.Dir(), "mirrors", "*.git"))
	require.Len(t, mirrors, 1, "a's mirror made room for b's")
	_, hit := checkout(t, c, b.URL, b.Main, repocache.Auth{})
	require.True(t, hit, "the one just used stays")
	_, hit = checkout(t, c, a.URL, a.Main, repocache.Auth{})
	require.False(t, hit, "a was evicted")
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	_, err := repocache.Open(repocache.Config{})
	require.ErrorContains(t, err, "Dir is required")
	c := open(t, 0)
	_, err = c.Link(ctx(t), "file:///nowhere", "main", repocache.Auth{}, t.TempDir())
	require.ErrorContains(t, err, "not a commit id")
	_, err = c.LsRemote(ctx(t), "file:///nowhere/at/all.git", "main", repocache.Auth{})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "ls-remote"), err)
}
