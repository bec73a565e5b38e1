package sandbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// TestLocalRecyclesPristineDirectories: a destroyed sandbox whose tree
// nothing wrote to goes to the pool, and the next Create takes it from
// there instead of making the directories again.
func TestLocalRecyclesPristineDirectories(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	ctx := testCtx(t)
	sb, err := b.local.Create(ctx, sandbox.Spec{ID: "first"})
	require.NoError(t, err)
	require.NoError(t, sb.Destroy(ctx))
	require.NoDirExists(t, filepath.Join(b.root, "first"))
	require.Len(t, entries(t, filepath.Join(b.root, ".pool")), 1, "the pristine tree is pooled")

	sb2 := b.create(t, "second", nil)
	require.Empty(t, entries(t, filepath.Join(b.root, ".pool")), "the next Create took it")
	for _, d := range []string{"work", "home", "home/.claude", "tmp"} {
		require.DirExists(t, filepath.Join(b.root, "second", d))
	}
	require.NoError(t, sb2.WriteFile(ctx, "f", []byte("x")))
}

// TestLocalNeverRecyclesWrittenDirectories: a tree a run wrote to (in its
// workspace, its HOME, or by changing a directory's mode) is never handed
// to another sandbox; it is removed, and the trash ends empty.
func TestLocalNeverRecyclesWrittenDirectories(t *testing.T) {
	t.Parallel()
	b := setupLocal(t, sandbox.LocalConfig{})
	ctx := testCtx(t)
	write := map[string]func(dir string){
		"work": func(dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "work", "secret"), []byte("s"), 0o600))
		},
		"home": func(dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "home", ".claude", "creds"), []byte("s"), 0o600))
		},
		"root": func(dir string) { require.NoError(t, os.WriteFile(filepath.Join(dir, "extra"), []byte("s"), 0o600)) },
		"mode": func(dir string) { require.NoError(t, os.Chmod(filepath.Join(dir, "tmp"), 0o777)) },
		"file": func(dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "tmp")))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp"), nil, 0o700))
		},
		"many": func(dir string) { // more entries than one directory read returns
			for i := range 200 {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "work", fmt.Sprintf("file-%03d", i)), nil, 0o600))
			}
		},
		"link": func(dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "tmp")))
			require.NoError(t, os.Symlink(t.TempDir(), filepath.Join(dir, "tmp")))
		},
	}
	for name, fn := range write {
		sb, err := b.local.Create(ctx, sandbox.Spec{ID: "w-" + name})
		require.NoError(t, err)
		fn(filepath.Join(b.root, "w-"+name))
		require.NoError(t, sb.Destroy(ctx))
		require.Empty(t, entries(t, filepath.Join(b.root, ".pool")), "%s: a written tree is not pooled", name)
		require.Empty(t, entries(t, filepath.Join(b.root, ".trash")), "%s: the trash is emptied", name)

		next := b.create(t, "n-"+name, nil)
		dir := filepath.Join(b.root, "n-"+name)
		require.Empty(t, entries(t, filepath.Join(dir, "work")))
		require.Equal(t, []string{".claude"}, entries(t, filepath.Join(dir, "home")))
		require.Empty(t, entries(t, filepath.Join(dir, "home", ".claude")))
		require.NoError(t, next.Destroy(ctx))
	}
}
