package journal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// memoryConfig is testConfig with the memory-first journal on, spilling
// after spillAfter of the fake clock.
func memoryConfig(t *testing.T, store Store, clock *fakeClock, spillAfter time.Duration) Config {
	cfg := testConfig(t, store)
	cfg.Test.NowFunc, cfg.Test.NewTimerFunc = clock.Now, clock.NewTimer
	cfg.SpillAfter = spillAfter
	return cfg
}

// TestMemoryFirstHappyPathWritesNothing: lines the stream acknowledges
// never touch the disk or storage, and the log ends without a hook call.
func TestMemoryFirstHappyPathWritesNothing(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	cfg := memoryConfig(t, store, newFakeClock(), time.Hour)
	var hooks atomic.Int64
	cfg.AssembleFunc = func(context.Context, string, string) error { hooks.Add(1); return nil }
	j := startJournal(t, cfg)
	for q := range 3 {
		id := "q" + string(rune('a'+q))
		l, err := j.Open("acme", id, 1)
		require.NoError(t, err)
		appendLines(t, l, 1, 100, 200)
		l.Ack(60)
		appendLines(t, l, 101, 120, 200)
		l.Ack(120)
		require.NoError(t, l.Close(true))
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", id))
	}
	require.Empty(t, dirFiles(t, cfg.Dir), "no file was written")
	require.Zero(t, store.putCount(), "nothing was put to storage")
	require.Zero(t, hooks.Load(), "nothing to assemble")
	lines, _ := j.Backlog()
	require.Zero(t, lines)
}

// TestMemoryFirstSpillsWhatTheStreamDidNotAck: lines not acknowledged for
// SpillAfter go to disk; when the log ends, only the lines the stream never
// acknowledged are put to storage.
func TestMemoryFirstSpillsWhatTheStreamDidNotAck(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	clock := newFakeClock()
	cfg := memoryConfig(t, store, clock, time.Second)
	cfg.NonFinalFunc = func(context.Context, string, string) error { return nil }
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	all := appendLines(t, l, 1, 10, 100)
	l.Ack(4)
	require.Empty(t, dirFiles(t, cfg.Dir))
	clock.Advance(2 * time.Second) // NATS is slow: lines 5-10 wait too long
	eventually(t, func() bool { return len(dirFiles(t, cfg.Dir)) > 0 }, "the unacknowledged lines spill to disk")
	l.Ack(7) // the stream took 5-7 after all
	require.NoError(t, l.Close(false))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, []string{storage.ChunkKey("acme", "q1", 8, 1)}, store.chunks("acme", "q1"))
	want := string(all[len(appendLinesBytes(1, 7, 100)):])
	require.Equal(t, want, string(store.joined("acme", "q1")), "only lines 8-10, which never reached the stream")
	require.Empty(t, dirFiles(t, cfg.Dir), "the spilled files are removed once stored")
}

// appendLinesBytes is what appendLines returns, without a log.
func appendLinesBytes(from, to uint64, size int) []byte {
	var b []byte
	for s := from; s <= to; s++ {
		b = append(b, line(s, size)...)
		b = append(b, '\n')
	}
	return b
}

// TestMemoryFirstFullDisk: while the disk is full a spill fails; the
// journal says it is full, Append and Close still succeed (the lines are
// held in memory, none dropped), and once the disk has room the lines
// spill and are stored by themselves.
func TestMemoryFirstFullDisk(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	clock := newFakeClock()
	cfg := memoryConfig(t, store, clock, time.Second)
	cfg.SpaceProbeInterval = 5 * time.Millisecond
	var full atomic.Bool
	cfg.Test.WriteFault = func(op string) error {
		if full.Load() {
			return syscall.ENOSPC
		}
		return nil
	}
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	full.Store(true)
	want := appendLines(t, l, 1, 5, 100)
	clock.Advance(2 * time.Second)
	eventually(t, func() bool { r, _ := j.Full(); return r != nil }, "the failed spill reports the full disk")
	reason, recovered := j.Full()
	require.ErrorContains(t, reason, "journal disk full")
	want = append(want, appendLines(t, l, 6, 6, 100)...) // still taken
	require.NoError(t, l.Close(false))
	require.Empty(t, dirFiles(t, cfg.Dir), "a failed spill leaves no partial WAL")
	require.Zero(t, store.putCount())

	full.Store(false)
	waitOrTimeout(t, recovered)
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want), string(store.joined("acme", "q1")), "every line held in memory is stored")
}

// TestMemoryFirstStopSpillsForRecovery: lines not acknowledged when the
// journal stops (storage down) are spilled, and the next Start stores them.
func TestMemoryFirstStopSpillsForRecovery(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	down := newFlaky(store)
	down.setDown(true)
	cfg := memoryConfig(t, down, newFakeClock(), time.Hour)
	j, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j.Start(t.Context()))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 3, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, j.Stop(ctx), ErrNotPersisted)
	require.NotEmpty(t, dirFiles(t, cfg.Dir), "spilled at Stop")

	cfg.Store = store
	j2 := startJournal(t, cfg)
	require.NoError(t, j2.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want), string(store.joined("acme", "q1")))
}

// TestMemoryFirstLargeLineStoredWhole: a line too large for NATS spills at
// once and reaches storage whole even when the stream acknowledges its
// pointer (the archiver reads it from there).
func TestMemoryFirstLargeLineStoredWhole(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	cfg := memoryConfig(t, store, newFakeClock(), time.Hour)
	cfg.LargeLineBytes = 100
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	big := line(2, 5000)
	require.NoError(t, l.Append(1, line(1, 50)))
	require.NoError(t, l.AppendWhole(2, big))
	require.NoError(t, l.Append(3, line(3, 50)))
	l.Ack(3)
	require.NoError(t, l.Close(true))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	v, ok := store.get(storage.LineKey("acme", "q1", 2))
	require.True(t, ok)
	require.Equal(t, string(big), string(v))
}

// TestMemoryFirstFullTmpfs: a memory-first log whose spill meets a real
// full disk (a 2 MiB tmpfs filled up) keeps its lines in memory, the
// journal says it is full, and once room returns every line is stored.
// Needs root to mount; CI runs as root.
func TestMemoryFirstFullTmpfs(t *testing.T) {
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
	clock := newFakeClock()
	cfg := memoryConfig(t, store, clock, time.Second)
	cfg.Dir = filepath.Join(dir, "journal")
	cfg.ReserveBytes = 16 << 10
	cfg.SpaceProbeInterval = 10 * time.Millisecond
	j := startJournal(t, cfg)
	// Fill the disk.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	require.NoError(t, err)
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	require.NoError(t, f.Close())

	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 100, 1024) // 100 KiB: more than the reserve
	clock.Advance(2 * time.Second)
	eventually(t, func() bool { r, _ := j.Full(); return r != nil }, "the failed spill reports the full disk")
	_, recovered := j.Full()
	require.NoError(t, l.Close(false), "closing never fails for want of disk")

	require.NoError(t, os.Remove(filler)) // room again
	waitOrTimeout(t, recovered)
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want), string(store.joined("acme", "q1")), "every line held in memory is stored")
}
