package worker

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// What the worker restores into a checkout it does not own (a contained
// sandbox's, whose agent runs as another uid) is handed to the
// checkout's owner; a checkout of the worker's own is left alone.
func TestGiveToAgentHandsRestoredFilesToTheCheckoutsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root (the worker is root when it contains agents)")
	}
	const agentUID = 64123
	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "vendor", "lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(work, "vendor", "lib", "a.txt"), []byte("x"), 0o644))
	require.NoError(t, os.Symlink("lib/a.txt", filepath.Join(work, "vendor", "link")))

	// The worker's own checkout: nothing changes.
	require.NoError(t, giveToAgent(work))
	require.Equal(t, 0, ownerOf(t, filepath.Join(work, "vendor", "lib", "a.txt")))

	require.NoError(t, os.Chown(work, agentUID, agentUID))
	require.NoError(t, giveToAgent(work))
	for _, p := range []string{"vendor", "vendor/lib", "vendor/lib/a.txt", "vendor/link"} {
		require.Equal(t, agentUID, ownerOf(t, filepath.Join(work, p)), p)
	}
}

func ownerOf(t *testing.T, p string) int {
	t.Helper()
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}
