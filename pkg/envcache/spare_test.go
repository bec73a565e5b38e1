package envcache_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/envcache"
)

// start starts f's cache (stopped when the test ends) and returns its
// events.
func (f *fixture) start(t *testing.T) <-chan envcache.Event {
	return start(t, f.cache)
}

func start(t *testing.T, c *envcache.Cache) <-chan envcache.Event {
	t.Helper()
	events := c.Events()
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Stop(ctx))
	})
	return events
}

// next waits for the next event of key of one of kinds (others are
// skipped).
func next(t *testing.T, events <-chan envcache.Event, key string, kinds ...envcache.EventKind) envcache.Event {
	t.Helper()
	timeout := time.After(time.Minute) // a hang's bound, not a measure
	for {
		select {
		case ev := <-events:
			for _, k := range kinds {
				if ev.Key == key && ev.Kind == k {
					return ev
				}
			}
		case <-timeout:
			t.Fatalf("no event %v of %s", kinds, key)
		}
	}
}

// copier opens the fixture's directory without prepared copies: its
// restores copy, as every restore did before prepared copies.
func (f *fixture) copier(t *testing.T) *envcache.Cache {
	c, err := envcache.Open(envcache.Config{Dir: filepath.Join(f.dir, "envs"), Spares: envcache.NoSpares})
	require.NoError(t, err)
	return c
}

// tree describes every path of a checkout but .git: kind, mode, the
// contents' hash or the link's target. Files must have one link (a copy,
// never a hard link into the cache).
func tree(t *testing.T, wd string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(wd, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(wd, p)
		if rel == ".git" {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			require.NoError(t, err)
			out[rel] = "l " + target
		case fi.IsDir():
			out[rel] = "d " + fi.Mode().Perm().String()
		default:
			require.Equal(t, uint64(1), uint64(fi.Sys().(*syscall.Stat_t).Nlink), "%s is a copy", rel) //nolint:unconvert // Nlink is not uint64 everywhere
			sum := sha256.Sum256([]byte(read(t, p)))
			out[rel] = "f " + fi.Mode().Perm().String() + " " + hex.EncodeToString(sum[:])
		}
		return nil
	}))
	return out
}

// copied is the tree a restore by copying makes of key in a new checkout.
func (f *fixture) copied(t *testing.T, key string) map[string]string {
	_, wd := f.checkout(t)
	res, err := f.copier(t).Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Hit)
	require.False(t, res.Prepared)
	return tree(t, wd)
}

func (f *fixture) spareDirs(t *testing.T, key string) []string {
	m, err := filepath.Glob(filepath.Join(f.dir, "envs", "spares", key, "*"))
	require.NoError(t, err)
	return m
}

// After a save the cache prepares a copy in the background; a restore
// moves it in (Result.Prepared) and the cache prepares the next; the
// second restore is served the same way. Both trees are exactly what a
// copy makes: contents, modes, links, no hard links.
func TestPreparedRestoresGiveTheCopysTree(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	events := f.start(t)
	key, _, _ := f.setup(t, setupScript)
	ev := next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed)
	require.Equal(t, envcache.EventPrepared, ev.Kind, "%v", ev.Err)
	require.Positive(t, ev.Took)
	want := f.copied(t, key)
	require.Contains(t, want, "node_modules/.bin-run")

	for i := range 2 {
		_, wd := f.checkout(t)
		res, err := f.cache.Restore(t.Context(), key, wd)
		require.NoError(t, err)
		require.True(t, res.Hit)
		require.True(t, res.Prepared, "restore %d came from the prepared copy", i+1)
		require.Equal(t, want, tree(t, wd), "restore %d", i+1)
		ev := next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed)
		require.Equal(t, envcache.EventPrepared, ev.Kind, "refilled after restore %d: %v", i+1, ev.Err)
	}
	require.Len(t, f.spareDirs(t, key), 1, "one prepared copy per key")
	// The agent writing a moved file does not change the cache.
	_, wd := f.checkout(t)
	res, err := f.cache.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Prepared)
	require.NoError(t, os.WriteFile(filepath.Join(wd, "out.txt"), []byte("agent wrote\n"), 0o644))
	require.Equal(t, want, f.copied(t, key))
}

// A prepared copy that does not match its manifest is dropped, never
// served: the restore copies from the entry and the tree is the copy's.
func TestADamagedPreparedCopyIsNeverServed(t *testing.T) {
	t.Parallel()
	for name, damage := range map[string]func(t *testing.T, files string){
		"truncated file": func(t *testing.T, files string) {
			require.NoError(t, os.Truncate(filepath.Join(files, "out.txt"), 2))
		},
		"same size, other mode": func(t *testing.T, files string) {
			require.NoError(t, os.Chmod(filepath.Join(files, "node_modules/.bin-run"), 0o777))
		},
		"deleted file": func(t *testing.T, files string) {
			require.NoError(t, os.Remove(filepath.Join(files, "node_modules/left-pad/lib/m2.js")))
		},
		"added file": func(t *testing.T, files string) {
			require.NoError(t, os.WriteFile(filepath.Join(files, "node_modules/left-pad/extra.js"), []byte("x"), 0o644))
		},
		"redirected link": func(t *testing.T, files string) {
			require.NoError(t, os.Remove(filepath.Join(files, "node_modules/main.js")))
			require.NoError(t, os.Symlink("left-pad/lib/m2.js", filepath.Join(files, "node_modules/main.js")))
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 0)
			events := f.start(t)
			key, _, _ := f.setup(t, setupScript)
			require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)
			want := f.copied(t, key)
			spares := f.spareDirs(t, key)
			require.Len(t, spares, 1)
			damage(t, filepath.Join(spares[0], "files"))

			_, wd := f.checkout(t)
			res, err := f.cache.Restore(t.Context(), key, wd)
			require.NoError(t, err)
			require.True(t, res.Hit)
			require.False(t, res.Prepared, "the damaged copy was not served")
			require.Equal(t, want, tree(t, wd), "the restore copied")
			ev := next(t, events, key, envcache.EventSpareDropped)
			require.ErrorIs(t, ev.Err, envcache.ErrCorrupt)
			require.NoDirExists(t, spares[0], "dropped")
			claimed, err := filepath.Glob(filepath.Join(f.dir, "envs", ".claimed-*"))
			require.NoError(t, err)
			require.Empty(t, claimed, "nothing of it left")
		})
	}
}

// Two restores at once with one prepared copy: one moves it in, the other
// copies; both trees are right.
func TestConcurrentRestoresClaimOnePreparedCopyOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	events := f.start(t)
	key, _, _ := f.setup(t, setupScript)
	require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)
	want := f.copied(t, key) // its Cache keeps the directory open
	// No refill from here on: exactly one prepared copy for both.
	require.NoError(t, f.cache.Stop(t.Context()))
	wds := []string{}
	for range 2 {
		_, wd := f.checkout(t)
		wds = append(wds, wd)
	}
	results := make([]envcache.Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, wd := range wds {
		wg.Go(func() { results[i], errs[i] = f.cache.Restore(context.Background(), key, wd) })
	}
	wg.Wait()
	prepared := 0
	for i, wd := range wds {
		require.NoError(t, errs[i])
		require.True(t, results[i].Hit)
		if results[i].Prepared {
			prepared++
		}
		require.Equal(t, want, tree(t, wd), "restore %d", i)
	}
	require.Equal(t, 1, prepared, "one restore got the prepared copy")
	for {
		select {
		case ev := <-events:
			require.NotEqual(t, envcache.EventSpareDropped, ev.Kind, "no restore found its claimed copy taken from under it: %v", ev.Err)
			continue
		default:
		}
		break
	}
}

// The setup wrote into directories the checkout has (src/ is tracked):
// the move descends into them and renames only what is new, the
// directory's saved mode applied as a copy applies it; the tracked files
// stay.
func TestAPreparedCopyMergesIntoExistingDirectories(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	events := f.start(t)
	_, wd := f.checkout(t)
	require.NoError(t, os.MkdirAll(filepath.Join(wd, "src"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "main.go"), []byte("package main\n"), 0o644))
	// The "setup": new files under the tracked src/, a new subdirectory,
	// a modified tracked file, src/ itself chmodded.
	require.NoError(t, os.MkdirAll(filepath.Join(wd, "src", "gen", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "gen", "x.go"), []byte("package gen\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "gen", "sub", "y.go"), []byte("package sub\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "new.txt"), []byte("new\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(wd, "README"), []byte("rewritten\n"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(wd, "src"), 0o750))
	key := strings.Repeat("ab", 32)
	_, err := f.cache.Save(t.Context(), key, wd, []string{"src", "README"})
	require.NoError(t, err)
	require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)

	fresh := func() string {
		_, wd := f.checkout(t)
		require.NoError(t, os.MkdirAll(filepath.Join(wd, "src"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "main.go"), []byte("package main\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(wd, "src", "local.txt"), []byte("only in the checkout\n"), 0o644))
		return wd
	}
	cwd := fresh()
	res, err := f.copier(t).Restore(t.Context(), key, cwd)
	require.NoError(t, err)
	require.False(t, res.Prepared)
	want := tree(t, cwd)
	require.Equal(t, "d -rwxr-x---", want["src"])
	require.Contains(t, want, "src/local.txt")

	pwd := fresh()
	res, err = f.cache.Restore(t.Context(), key, pwd)
	require.NoError(t, err)
	require.True(t, res.Prepared, "merged, not copied")
	require.Equal(t, want, tree(t, pwd))
}

// A symbolic link in the checkout where the prepared copy has a
// directory does not redirect the move: nothing is written outside the
// checkout (the restore fails as a copy does). A link where the copy has
// a file is replaced, not written through.
func TestASymlinkInTheCheckoutCannotRedirectAMove(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	events := f.start(t)
	key, _, _ := f.setup(t, setupScript)
	require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)

	_, wd := f.checkout(t)
	outside := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(wd, "node_modules"), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(wd, "node_modules", "left-pad")))
	_, err := f.cache.Restore(t.Context(), key, wd)
	require.Error(t, err)
	ev := next(t, events, key, envcache.EventSpareDropped)
	require.ErrorContains(t, ev.Err, "node_modules/left-pad")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was written outside the checkout")

	require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)
	_, wd = f.checkout(t)
	target := filepath.Join(t.TempDir(), "target.txt")
	require.NoError(t, os.WriteFile(target, []byte("outside\n"), 0o644))
	require.NoError(t, os.Symlink(target, filepath.Join(wd, "out.txt")))
	res, err := f.cache.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Prepared)
	require.Equal(t, "outside\n", read(t, target), "the link was replaced, not written through")
	fi, err := os.Lstat(filepath.Join(wd, "out.txt"))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular())
	require.Equal(t, "built\n", read(t, filepath.Join(wd, "out.txt")))
}

// What a killed worker left (copies being prepared or claimed, temporary
// entries, prepared copies) is removed when the cache is opened again,
// not while another Cache has the directory open; the entries stay.
func TestOpenRemovesWhatAKilledWorkerLeft(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	events := f.start(t)
	key, _, _ := f.setup(t, setupScript)
	require.Equal(t, envcache.EventPrepared, next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)
	envs := filepath.Join(f.dir, "envs")
	leftovers := []string{
		filepath.Join(envs, "spares", key, ".tmp-0123456789abcdef"),
		filepath.Join(envs, ".claimed-0123456789abcdef"),
		filepath.Join(envs, ".tmp-0123456789abcdef"),
	}
	for _, d := range leftovers {
		require.NoError(t, os.MkdirAll(filepath.Join(d, "files"), 0o700))
	}
	leftovers = append(leftovers, f.spareDirs(t, key)...)

	other, err := envcache.Open(envcache.Config{Dir: envs})
	require.NoError(t, err)
	for _, d := range leftovers {
		require.DirExists(t, d, "kept while another Cache has the directory open")
	}
	require.NoError(t, other.Stop(t.Context()))
	require.NoError(t, f.cache.Stop(t.Context())) // as a kill releases its lock

	again, err := envcache.Open(envcache.Config{Dir: envs})
	require.NoError(t, err)
	for _, d := range leftovers {
		require.NoDirExists(t, d)
	}
	require.Zero(t, again.Spares(key))
	_, wd := f.checkout(t)
	res, err := again.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Hit, "the entry stayed")
	require.False(t, res.Prepared)
}

// Spares NoSpares prepares nothing: every restore copies.
func TestNoSparesPreparesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	c := f.copier(t)
	start(t, c)
	key, _, _ := f.setup(t, setupScript) // saved through f.cache, not started
	_, wd := f.checkout(t)
	res, err := c.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Hit)
	require.False(t, res.Prepared)
	require.NoError(t, c.Stop(t.Context())) // waits for any preparation
	require.NoDirExists(t, filepath.Join(f.dir, "envs", "spares"))
}

// A preparation that cannot be done (the copy would pass the bound: it
// counts against it; a directory that cannot be written) is an event,
// and restores copy.
func TestAFailedPreparationNeverFailsARestore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	key, _, _ := f.setup(t, setupScript)
	_, wd := f.checkout(t)
	res, err := f.cache.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	envs := filepath.Join(f.dir, "envs")

	tight, err := envcache.Open(envcache.Config{Dir: envs, MaxBytes: res.Bytes + res.Bytes/2})
	require.NoError(t, err)
	events := start(t, tight)
	_, wd = f.checkout(t)
	res, err = tight.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Hit)
	ev := next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed)
	require.Equal(t, envcache.EventPrepareFailed, ev.Kind)
	require.ErrorIs(t, ev.Err, envcache.ErrNoRoom)
	require.Zero(t, tight.Spares(key))

	require.NoError(t, os.WriteFile(filepath.Join(envs, "spares"), []byte("in the way, as a full disk would be"), 0o600))
	roomy, err := envcache.Open(envcache.Config{Dir: envs})
	require.NoError(t, err)
	events = start(t, roomy)
	for range 2 {
		_, wd = f.checkout(t)
		res, err = roomy.Restore(t.Context(), key, wd)
		require.NoError(t, err)
		require.True(t, res.Hit)
		require.False(t, res.Prepared)
		require.Equal(t, "built\n", read(t, filepath.Join(wd, "out.txt")))
		ev = next(t, events, key, envcache.EventPrepared, envcache.EventPrepareFailed)
		require.Equal(t, envcache.EventPrepareFailed, ev.Kind)
	}
}

// Prepared copies count against the bound and go before entries: a save
// that passes it drops the least recently used entry's copy, not the
// entry, and a copy that would not fit is not made.
func TestPreparedCopiesGoBeforeEntries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	k1, _, _ := f.setup(t, setupScript)
	_, wd := f.checkout(t)
	res, err := f.copier(t).Restore(t.Context(), k1, wd)
	require.NoError(t, err)
	size := res.Bytes
	require.Greater(t, size, int64(20))

	bounded, err := envcache.Open(envcache.Config{Dir: filepath.Join(f.dir, "envs"), MaxBytes: size * 5 / 2})
	require.NoError(t, err)
	events := start(t, bounded)
	_, wd = f.checkout(t)
	_, err = bounded.Restore(t.Context(), k1, wd)
	require.NoError(t, err)
	require.Equal(t, envcache.EventPrepared, next(t, events, k1, envcache.EventPrepared, envcache.EventPrepareFailed).Kind)
	require.Equal(t, 1, bounded.Spares(k1))

	f.cache = bounded
	k2, _, _ := f.setup(t, setupScript+"echo 2 > two.txt\n") // its entry and k1's, with k1's copy, pass the bound
	require.DirExists(t, filepath.Join(f.dir, "envs", k1), "the entry stayed")
	require.DirExists(t, filepath.Join(f.dir, "envs", k2))
	require.Zero(t, bounded.Spares(k1), "its prepared copy went")
	ev := next(t, events, k2, envcache.EventPrepared, envcache.EventPrepareFailed)
	require.ErrorIs(t, ev.Err, envcache.ErrNoRoom, "no room for a copy of the second")
}
