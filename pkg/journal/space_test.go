package journal

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFullDiskSeam: with the disk full (the WriteFault seam returns
// ENOSPC), Append fails with ErrNoSpace and records nothing, the journal
// says it is full and releases its reserve, the flusher still persists and
// assembles what was journaled, and the journal recovers by itself once
// the disk has room.
func TestFullDiskSeam(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	cfg := testConfig(t, store)
	cfg.AssembleFunc = store.assemble
	cfg.SpaceProbeInterval = 5 * time.Millisecond
	var full atomic.Bool
	cfg.Test.WriteFault = func(op string) error {
		if full.Load() && (op == "wal" || op == "probe" || op == "reserve") {
			return syscall.ENOSPC
		}
		return nil
	}
	j := startJournal(t, cfg)
	reason, _ := j.Full()
	require.NoError(t, reason)
	require.FileExists(t, filepath.Join(cfg.Dir, reserveFile))

	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 10, 100)
	full.Store(true)
	err = l.Append(11, line(11, 100))
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorIs(t, err, syscall.ENOSPC)
	reason, recovered := j.Full()
	require.Error(t, reason)
	require.Contains(t, reason.Error(), "journal disk full")
	require.NoFileExists(t, filepath.Join(cfg.Dir, reserveFile), "the reserve is released")

	// The journal still persists and assembles what it holds.
	require.NoError(t, l.Close(true))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	got, ok := store.get("queries/acme/q1/transcript.ndjson")
	require.True(t, ok)
	require.Equal(t, want, got)

	full.Store(false)
	waitOrTimeout(t, recovered)
	reason, _ = j.Full()
	require.NoError(t, reason)
	require.FileExists(t, filepath.Join(cfg.Dir, reserveFile), "the reserve is back")
	l2, err := j.Open("acme", "q2", 1)
	require.NoError(t, err)
	require.NoError(t, l2.Append(1, line(1, 100)))
}

// TestFullDiskTmpfs fills a real 2 MiB tmpfs: the flusher must still record
// chunks (a state file write) and free the space, and the journal recovers
// by itself. Needs root to mount; CI runs as root.
func TestFullDiskTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs (CI runs as root)")
	}
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", dir).CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount tmpfs: %v: %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	store := newMemStore()
	cfg := testConfig(t, store)
	cfg.Dir = filepath.Join(dir, "journal")
	cfg.AssembleFunc = store.assemble
	cfg.ReserveBytes = 256 << 10
	cfg.SpaceProbeInterval = 10 * time.Millisecond
	cfg.ChunkBytes = 64 << 10
	j := startJournal(t, cfg)

	l, err := j.Open("acme", "big", 1)
	require.NoError(t, err)
	var want []byte
	var seq uint64
	for seq = 1; seq < 10000; seq++ {
		ln := line(seq, 1024)
		if err := l.Append(seq, ln); err != nil {
			require.ErrorIs(t, err, ErrNoSpace)
			break
		}
		want = append(append(want, ln...), '\n')
	}
	require.Less(t, seq, uint64(10000), "the 2 MiB disk must fill")
	reason, recovered := j.Full()
	require.Error(t, reason)

	// Closing and persisting must work on the full disk, and free it.
	_ = l.Close(true) // its state write may fail; the flusher retries
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "big"))
	got, ok := store.get("queries/acme/big/transcript.ndjson")
	require.True(t, ok)
	require.Equal(t, want, got, "every journaled line is in the transcript")
	waitOrTimeout(t, recovered)
	l2, err := j.Open("acme", "small", 1)
	require.NoError(t, err)
	for s := uint64(1); s <= 5; s++ {
		require.NoError(t, l2.Append(s, line(s, 1024)))
	}
	require.NoError(t, l2.Close(true))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "small"))
}
