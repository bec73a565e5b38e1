package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitReadyEndsWhenTheProcessExits: a child that exits before it is
// ready ends the wait at once, with its exit status and its log.
func TestWaitReadyEndsWhenTheProcessExits(t *testing.T) {
	t.Parallel()
	p := startProc(t, "sh", filepath.Join(t.TempDir(), "sh.log"), "/bin/sh", "-c", "echo cannot start: boom; exit 3")
	err := p.waitReady(t, func() bool { return false })
	require.ErrorIs(t, err, errExited)
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "cannot start: boom")
}

// TestStartServingStartsAgainOnATakenPort: a child that exits because its
// address was taken is started again, with the arguments made anew.
func TestStartServingStartsAgainOnATakenPort(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tries := 0
	p := startServing(t, "sh", filepath.Join(dir, "sh.log"), "/bin/sh", func() []string {
		tries++
		if tries == 1 {
			return []string{"-c", "echo listen tcp 127.0.0.1:1: bind: address already in use; exit 1"}
		}
		return []string{"-c", "touch " + filepath.Join(dir, "up") + "; exec sleep 600"}
	}, func() bool { return fileExists(filepath.Join(dir, "up")) })
	require.Equal(t, 2, tries)
	select {
	case <-p.exited:
		t.Fatal("the second start exited")
	default:
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
