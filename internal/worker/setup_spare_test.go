package worker

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// A contained agent runs as uid 1000: an environment restored from a
// prepared copy (moved in) and handed to it is owned, moded and linked
// exactly as one restored by copying.
func TestPreparedRestoreIsTheAgentsAsACopyIs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root (the worker is root when it contains agents)")
	}
	const agentUID = 1000
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	workspacetest.Git(t, dir, "init", "-q", "-b", "main", src)
	require.NoError(t, os.WriteFile(filepath.Join(src, "README"), []byte("readme\n"), 0o644))
	workspacetest.Git(t, src, "add", "-A")
	workspacetest.Git(t, src, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")
	n := 0
	checkout := func() string {
		n++
		wd := filepath.Join(dir, "wd", strings.Repeat("w", n))
		workspacetest.Git(t, dir, "clone", "-q", src, wd)
		require.NoError(t, filepath.WalkDir(wd, func(p string, _ fs.DirEntry, err error) error {
			require.NoError(t, err)
			return os.Lchown(p, agentUID, agentUID) // the contained sandbox's checkout
		}))
		return wd
	}
	made := checkout()
	require.NoError(t, os.MkdirAll(filepath.Join(made, "vendor", "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(made, "vendor", "lib", "a.txt"), []byte("a\n"), 0o640))
	require.NoError(t, os.Symlink("lib/a.txt", filepath.Join(made, "vendor", "link")))
	require.NoError(t, os.WriteFile(filepath.Join(made, "README"), []byte("changed\n"), 0o644))

	envs := filepath.Join(dir, "envs")
	cache, err := envcache.Open(envcache.Config{Dir: envs})
	require.NoError(t, err)
	events := cache.Events()
	require.NoError(t, cache.Start(t.Context()))
	defer func() { require.NoError(t, cache.Stop(context.Background())) }()
	key := strings.Repeat("cd", 32)
	_, err = cache.Save(t.Context(), key, made, []string{"vendor", "README"})
	require.NoError(t, err)
	select {
	case ev := <-events:
		require.Equal(t, envcache.EventPrepared, ev.Kind, "%v", ev.Err)
	case <-time.After(time.Minute): // a hang's bound
		t.Fatal("no prepared copy")
	}
	copier, err := envcache.Open(envcache.Config{Dir: envs, Spares: envcache.NoSpares})
	require.NoError(t, err)

	restored := map[bool]map[string]string{}
	for _, c := range []*envcache.Cache{cache, copier} {
		wd := checkout()
		res, err := c.Restore(t.Context(), key, wd)
		require.NoError(t, err)
		require.NoError(t, giveToAgent(wd))
		restored[res.Prepared] = owners(t, wd)
	}
	require.Len(t, restored, 2, "one restore moved a prepared copy in, the other copied")
	require.Equal(t, restored[false], restored[true])
	require.Equal(t, "1000:1000 -rw-r-----", restored[true]["vendor/lib/a.txt"])
}

// owners describes each path but .git: owner, group and mode.
func owners(t *testing.T, wd string) map[string]string {
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(wd, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(wd, p)
		if rel == ".git" {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		out[rel] = strings.Join([]string{itoa(st.Uid) + ":" + itoa(st.Gid), fi.Mode().String()}, " ")
		return nil
	}))
	return out
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
