package envcache_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setupScript builds an environment as a real setup would: it reads its
// input, writes ignored dependencies, an untracked build output, a
// symbolic link, and modifies a tracked file.
const setupScript = `# inputs: deps.lock
echo installing $(cat deps.lock)
mkdir -p node_modules/left-pad/lib
for i in 1 2 3; do echo "module $i" > node_modules/left-pad/lib/m$i.js; done
printf '#!/bin/sh\necho hi\n' > node_modules/.bin-run && chmod 755 node_modules/.bin-run
ln -s left-pad/lib/m1.js node_modules/main.js
ln -s /usr/bin/env node_modules/env
echo built > out.txt
echo changed >> README
echo done >&2
`

var seq atomic.Int64

type fixture struct {
	local *sandbox.Local
	repo  string // a bare repository with deps.lock, README and .gitignore
	cache *envcache.Cache
	dir   string
}

func newFixture(t *testing.T, maxBytes int64) *fixture {
	dir := t.TempDir()
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(dir, "sandboxes")})
	require.NoError(t, err)
	work := filepath.Join(dir, "src")
	workspacetest.Git(t, dir, "init", "-q", "-b", "main", work)
	require.NoError(t, os.WriteFile(filepath.Join(work, "deps.lock"), []byte("left-pad@1.3.0\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, "README"), []byte("readme\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(work, ".gitignore"), []byte("node_modules/\n"), 0o644))
	workspacetest.Git(t, work, "add", "-A")
	workspacetest.Git(t, work, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")
	cache, err := envcache.Open(envcache.Config{Dir: filepath.Join(dir, "envs"), MaxBytes: maxBytes})
	require.NoError(t, err)
	return &fixture{local: local, repo: work, cache: cache, dir: dir}
}

// checkout clones the repository into a new sandbox's working directory.
func (f *fixture) checkout(t *testing.T) (sandbox.Sandbox, string) {
	sb, err := f.local.Create(t.Context(), sandbox.Spec{ID: "env-" + strconv.FormatInt(seq.Add(1), 10)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	wd := sb.(sandbox.HostWorkDir).HostWorkDir()
	workspacetest.Git(t, f.dir, "clone", "-q", f.repo, wd)
	return sb, wd
}

// setup runs the script in a fresh checkout and saves what it left.
func (f *fixture) setup(t *testing.T, script string) (key, wd string, lines []string) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb, wd := f.checkout(t)
	key, err := envcache.Key(f.repo, script, wd)
	require.NoError(t, err)
	before, err := envcache.TakeSnapshot(ctx, sb)
	require.NoError(t, err)
	require.NoError(t, envcache.RunSetup(ctx, sb, "", script, func(l string) { lines = append(lines, l) }))
	after, err := envcache.TakeSnapshot(ctx, sb)
	require.NoError(t, err)
	_, err = f.cache.Save(ctx, key, wd, envcache.Changed(before, after))
	require.NoError(t, err)
	return key, wd, lines
}

func read(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}

// What a setup left in the checkout comes back in a new checkout: files
// with their modes, links, the modified tracked file; as copies (never
// hard links into the cache).
func TestRestorePutsBackWhatTheSetupLeft(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	key, _, lines := f.setup(t, setupScript)
	require.Equal(t, []string{"installing left-pad@1.3.0", "done"}, lines)

	_, wd := f.checkout(t)
	key2, err := envcache.Key(f.repo, setupScript, wd)
	require.NoError(t, err)
	require.Equal(t, key, key2, "the same repository, script and inputs")
	res, err := f.cache.Restore(t.Context(), key, wd)
	require.NoError(t, err)
	require.True(t, res.Hit)
	require.Equal(t, "module 2\n", read(t, filepath.Join(wd, "node_modules/left-pad/lib/m2.js")))
	require.Equal(t, "built\n", read(t, filepath.Join(wd, "out.txt")))
	require.Equal(t, "readme\nchanged\n", read(t, filepath.Join(wd, "README")))
	target, err := os.Readlink(filepath.Join(wd, "node_modules/main.js"))
	require.NoError(t, err)
	require.Equal(t, "left-pad/lib/m1.js", target)
	target, err = os.Readlink(filepath.Join(wd, "node_modules/env"))
	require.NoError(t, err)
	require.Equal(t, "/usr/bin/env", target, "a link out of the checkout is kept as a link, not followed")
	fi, err := os.Stat(filepath.Join(wd, "node_modules/.bin-run"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	require.Equal(t, uint64(1), uint64(fi.Sys().(*syscall.Stat_t).Nlink), "a copy, not a hard link into the cache") //nolint:unconvert // Nlink is not uint64 on every platform
	require.NotContains(t, read(t, filepath.Join(wd, "README")), "deps", "tracked files are as the setup left them")

	// The agent writing a restored file does not change the cache.
	require.NoError(t, os.WriteFile(filepath.Join(wd, "out.txt"), []byte("agent wrote\n"), 0o644))
	_, wd3 := f.checkout(t)
	_, err = f.cache.Restore(t.Context(), key, wd3)
	require.NoError(t, err)
	require.Equal(t, "built\n", read(t, filepath.Join(wd3, "out.txt")))
}

// A changed input is another key; a missing entry is a miss.
func TestKeyFollowsTheInputs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	_, wd := f.checkout(t)
	k1, err := envcache.Key(f.repo, setupScript, wd)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(wd, "deps.lock"), []byte("left-pad@1.3.1\n"), 0o644))
	k2, err := envcache.Key(f.repo, setupScript, wd)
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)
	k3, err := envcache.Key("https://other.example/r.git", setupScript, wd)
	require.NoError(t, err)
	require.NotEqual(t, k2, k3, "the repository is part of the key")
	require.NoError(t, os.Remove(filepath.Join(wd, "deps.lock")))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(wd, "deps.lock")))
	_, err = envcache.Key(f.repo, setupScript, wd)
	require.Error(t, err, "an input may not lead out of the checkout")
	res, err := f.cache.Restore(t.Context(), k1, wd)
	require.NoError(t, err)
	require.False(t, res.Hit)
}

// A truncated file or an unsealed manifest: the entry is dropped, never
// served, and the next Save builds it again.
func TestACorruptEntryIsDroppedAndRebuilt(t *testing.T) {
	t.Parallel()
	for name, damage := range map[string]func(t *testing.T, entry string){
		"truncated file": func(t *testing.T, entry string) {
			require.NoError(t, os.Truncate(filepath.Join(entry, "files", "out.txt"), 2))
		},
		"unsealed manifest": func(t *testing.T, entry string) {
			m := filepath.Join(entry, "fleet-manifest")
			b := read(t, m)
			require.NoError(t, os.WriteFile(m, []byte(b[:len(b)-20]), 0o600))
		},
		"missing file": func(t *testing.T, entry string) {
			require.NoError(t, os.RemoveAll(filepath.Join(entry, "files", "node_modules")))
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, 0)
			key, _, _ := f.setup(t, setupScript)
			damage(t, filepath.Join(f.dir, "envs", key))
			_, wd := f.checkout(t)
			res, err := f.cache.Restore(t.Context(), key, wd)
			require.ErrorIs(t, err, envcache.ErrCorrupt)
			require.False(t, res.Hit)
			require.NoDirExists(t, filepath.Join(f.dir, "envs", key), "dropped")
			key2, _, _ := f.setup(t, setupScript)
			require.Equal(t, key, key2)
			_, wd = f.checkout(t)
			res, err = f.cache.Restore(t.Context(), key, wd)
			require.NoError(t, err)
			require.True(t, res.Hit, "rebuilt")
		})
	}
}

// Restoring never writes through a symbolic link of the checkout.
func TestRestoreStaysInsideTheCheckout(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	key, _, _ := f.setup(t, setupScript)
	_, wd := f.checkout(t)
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(wd, "node_modules")))
	_, err := f.cache.Restore(t.Context(), key, wd)
	require.Error(t, err)
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was written outside the checkout")
}

// The entries are bounded: the least recently used goes; an environment
// larger than the bound, or a cache that cannot write, fails Save with an
// error (the caller logs it) and leaves nothing behind.
func TestTheCacheIsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100)
	k1, _, _ := f.setup(t, setupScript)
	k2, _, _ := f.setup(t, setupScript+"echo second > second.txt\n")
	require.NoDirExists(t, filepath.Join(f.dir, "envs", k1), "the least recently used entry went")
	require.DirExists(t, filepath.Join(f.dir, "envs", k2))

	_, wd := f.checkout(t)
	big := make([]byte, 200)
	require.NoError(t, os.WriteFile(filepath.Join(wd, "big.bin"), big, 0o644))
	_, err := f.cache.Save(t.Context(), k1, wd, []string{"big.bin"})
	require.ErrorIs(t, err, envcache.ErrTooLarge)
	require.NoDirExists(t, filepath.Join(f.dir, "envs", k1))

	broken, err := envcache.Open(envcache.Config{Dir: filepath.Join(f.dir, "broken")})
	require.NoError(t, err)
	require.NoError(t, os.RemoveAll(filepath.Join(f.dir, "broken")))
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "broken"), []byte("in the way, as a full disk would be"), 0o600))
	_, err = broken.Save(t.Context(), k1, wd, []string{"big.bin"})
	require.Error(t, err)
}

// A setup may rewrite the checkout's .git/config; the snapshot after it
// runs no command that config names (it runs git hardened, inside the
// sandbox).
func TestTheSnapshotRunsNoCommandTheSetupConfigured(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	sb, wd := f.checkout(t)
	marker := filepath.Join(t.TempDir(), "ran")
	script := "git config core.fsmonitor 'touch " + marker + "; false'\ngit config core.hooksPath .hooks\necho x > new.txt\n"
	require.NoError(t, envcache.RunSetup(t.Context(), sb, "", script, func(string) {}))
	snap, err := envcache.TakeSnapshot(t.Context(), sb)
	require.NoError(t, err)
	require.Contains(t, snap, "new.txt")
	require.NoFileExists(t, marker, "the fsmonitor command the setup configured did not run")
	_ = wd
}

// Jobs saving the same environment at once: each Save succeeds, one
// entry stays, and it restores.
func TestConcurrentSavesOfOneKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	key, wd, _ := f.setup(t, setupScript)
	require.NoError(t, os.RemoveAll(filepath.Join(f.dir, "envs", key)))
	paths := []string{"node_modules", "out.txt", "README"}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := f.cache.Save(context.Background(), key, wd, paths)
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	entries, err := os.ReadDir(filepath.Join(f.dir, "envs"))
	require.NoError(t, err)
	dirs := 0
	for _, e := range entries {
		if e.IsDir() {
			dirs++
		}
	}
	require.Equal(t, 1, dirs, "one entry, no temporary directories left")
	_, wd2 := f.checkout(t)
	res, err := f.cache.Restore(t.Context(), key, wd2)
	require.NoError(t, err)
	require.True(t, res.Hit)
	require.Equal(t, "built\n", read(t, filepath.Join(wd2, "out.txt")))
}
