package journal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"Dir", func(c *Config) { c.Dir = "" }, "Dir is required"},
		{"Store", func(c *Config) { c.Store = nil }, "Store is required"},
		{"Fsync", func(c *Config) { c.Fsync = FsyncPolicy(7) }, "Fsync must be"},
		{"FsyncInterval", func(c *Config) { c.FsyncInterval = -time.Second }, "FsyncInterval must be positive"},
		{"ChunkBytes", func(c *Config) { c.ChunkBytes = -1 }, "ChunkBytes must be positive"},
		{"FlushInterval", func(c *Config) { c.FlushInterval = -time.Second }, "FlushInterval must be positive"},
		{"RetryMin", func(c *Config) { c.RetryMin = -time.Second }, "RetryMin must be positive"},
		{"RetryMax", func(c *Config) { c.RetryMin, c.RetryMax = time.Minute, time.Second }, "RetryMax must be at least RetryMin"},
		{"AttemptTimeout", func(c *Config) { c.AttemptTimeout = -time.Second }, "AttemptTimeout must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{Dir: t.TempDir(), Store: store}
			tt.modify(&cfg)
			_, err := New(cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tt.want)
		})
	}

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "a", "b")
		j, err := New(Config{Dir: dir, Store: store})
		require.NoError(t, err)
		require.DirExists(t, dir)
		require.Equal(t, FsyncInterval, j.cfg.Fsync)
		require.Equal(t, DefaultFsyncInterval, j.cfg.FsyncInterval)
		require.Equal(t, DefaultChunkBytes, j.cfg.ChunkBytes)
		require.Equal(t, DefaultFlushInterval, j.cfg.FlushInterval)
		require.Equal(t, DefaultLargeLineBytes, j.cfg.LargeLineBytes)
		require.Equal(t, DefaultRetryMin, j.cfg.RetryMin)
		require.Equal(t, DefaultRetryMax, j.cfg.RetryMax)
		require.Equal(t, DefaultAttemptTimeout, j.cfg.AttemptTimeout)
		require.NotNil(t, j.cfg.Logger)
	})
}

func TestPersistsLinesInOrderByteIdentical(t *testing.T) {
	t.Parallel()
	for _, policy := range []FsyncPolicy{FsyncInterval, FsyncAlways, FsyncNever} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			cfg := testConfig(t, store)
			cfg.Fsync = policy
			cfg.FsyncInterval = time.Millisecond
			cfg.ChunkBytes = 2000
			var assembled atomic.Int64
			cfg.AssembleFunc = func(context.Context, string, string) error { assembled.Add(1); return nil }
			j := startJournal(t, cfg)

			l, err := j.Open("acme", "q1", 1)
			require.NoError(t, err)
			var want []byte
			for s := uint64(1); s <= 300; s++ {
				ln := line(s, 20+int(s*37%400))
				if s == 150 {
					ln = []byte{} // empty lines are lines too
				}
				require.NoError(t, l.Append(s, ln))
				want = append(append(want, ln...), '\n')
			}
			require.NoError(t, l.Close(false))
			require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))

			require.Equal(t, string(want), string(store.joined("acme", "q1")))
			require.Greater(t, len(store.chunks("acme", "q1")), 1, "ChunkBytes splits the log")
			for _, k := range store.chunks("acme", "q1") {
				v, _ := store.get(k)
				require.LessOrEqual(t, len(v), 2000, "chunk %s", k)
			}
			store.requireIdempotent(t)
			require.Zero(t, assembled.Load(), "Close(false) does not assemble")
			require.Empty(t, dirFiles(t, cfg.Dir), "persisted logs leave no local files")
			lines, bytes := j.Backlog()
			require.Zero(t, lines)
			require.Zero(t, bytes)
		})
	}
}

func TestChunkBySize(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	clock := newFakeClock() // never advanced: no interval flush
	cfg := testConfig(t, store)
	cfg.ChunkBytes = 100
	cfg.Test.NowFunc, cfg.Test.NewTimerFunc = clock.Now, clock.NewTimer
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 2)
	require.NoError(t, err)

	// Lines of 30 bytes + newline: 3 fit in 100 bytes, the 4th reaches the limit.
	want := appendLines(t, l, 1, 1, 30)
	waitOrTimeout(t, clock.created) // the flusher now waits for FlushInterval
	want = append(want, appendLines(t, l, 2, 4, 30)...)
	first := storage.ChunkKey("acme", "q1", 1, 2)
	eventually(t, func() bool { _, ok := store.get(first); return ok }, "size-triggered chunk")
	v, _ := store.get(first)
	require.Equal(t, string(want[:93]), string(v), "chunk holds lines 1-3 only")
	require.Equal(t, 1, store.putCount(), "line 4 stays pending below ChunkBytes")

	require.NoError(t, l.Close(false))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, []string{first, storage.ChunkKey("acme", "q1", 4, 2)}, store.chunks("acme", "q1"))
	require.Equal(t, string(want), string(store.joined("acme", "q1")))
}

func TestChunkByInterval(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	clock := newFakeClock()
	cfg := testConfig(t, store)
	cfg.FlushInterval = time.Second
	cfg.Test.NowFunc, cfg.Test.NewTimerFunc = clock.Now, clock.NewTimer
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)

	want := appendLines(t, l, 1, 3, 50)
	require.Equal(t, time.Second, waitOrTimeout(t, clock.created), "flusher arms FlushInterval after the first line")
	clock.Advance(time.Second - time.Millisecond)
	// The flusher may be between a wake-up by a later line and re-arming
	// the rest of the interval: wait for the timer, not a snapshot.
	eventually(t, func() bool { return clock.armed() == 1 }, "not due yet: the interval timer stays armed")
	require.Zero(t, store.putCount())

	clock.Advance(time.Millisecond)
	eventually(t, func() bool { return store.putCount() == 1 }, "interval-triggered chunk")
	v, _ := store.get(storage.ChunkKey("acme", "q1", 1, 1))
	require.Equal(t, string(want), string(v))

	// The next lines start a new interval, measured from their own arrival.
	// (Forget the re-arms of the first interval: the flusher now waits
	// with no timer.)
	for len(clock.created) > 0 {
		<-clock.created
	}
	clock.Advance(10 * time.Second)
	want2 := appendLines(t, l, 4, 5, 50)
	require.Equal(t, time.Second, waitOrTimeout(t, clock.created))
	clock.Advance(time.Second)
	eventually(t, func() bool { return store.putCount() == 2 }, "second interval chunk")
	v, _ = store.get(storage.ChunkKey("acme", "q1", 4, 1))
	require.Equal(t, string(want2), string(v))
	require.NoError(t, l.Close(false))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
}

func TestChunkSplitsAtSeqGap(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	j := startJournal(t, testConfig(t, store))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	a := appendLines(t, l, 1, 3, 40)
	b := appendLines(t, l, 7, 8, 40)
	require.NoError(t, l.Close(false))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	v1, _ := store.get(storage.ChunkKey("acme", "q1", 1, 1))
	v7, _ := store.get(storage.ChunkKey("acme", "q1", 7, 1))
	require.Equal(t, string(a), string(v1))
	require.Equal(t, string(b), string(v7))
	require.Len(t, store.chunks("acme", "q1"), 2)
}

func TestStorageOutageDelaysButKeepsOrder(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	store := newFlaky(mem)
	cfg := testConfig(t, store)
	cfg.ChunkBytes = 500
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 80*time.Millisecond
	cfg.Test.SleepFunc = store.sleep
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)

	want := appendLines(t, l, 1, 20, 60) // some chunks persist while up
	eventually(t, func() bool { return mem.putCount() > 0 }, "first chunks persisted")
	store.setDown(true)
	want = append(want, appendLines(t, l, 21, 200, 60)...)
	waitOrTimeout(t, store.failed)
	lines, _ := j.Backlog()
	require.Positive(t, lines, "the outage grows the backlog")
	require.NoError(t, l.Close(true))
	store.setDown(false)

	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want), string(mem.joined("acme", "q1")), "nothing lost, nothing reordered")
	mem.requireIdempotent(t)
	require.Positive(t, store.failures.Load())
	store.mu2.Lock()
	for _, d := range store.backoffs {
		require.GreaterOrEqual(t, d, cfg.RetryMin/2)
		require.LessOrEqual(t, d, cfg.RetryMax)
	}
	store.mu2.Unlock()
	lines, bytes := j.Backlog()
	require.Zero(t, lines)
	require.Zero(t, bytes)
}

func TestAppendNeverBlocksOnStorage(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	store := newBlockingStore(mem)
	cfg := testConfig(t, store)
	cfg.ChunkBytes = 200
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)

	want := appendLines(t, l, 1, 5, 60)
	first := waitOrTimeout(t, store.entered)
	require.Equal(t, storage.ChunkKey("acme", "q1", 1, 1), first, "the flusher is stuck in its first Put")

	done := make(chan []byte)
	go func() {
		var b []byte
		for s := uint64(6); s <= 2000; s++ {
			ln := line(s, 60)
			if err := l.Append(s, ln); err != nil {
				break
			}
			b = append(append(b, ln...), '\n')
		}
		done <- b
	}()
	rest := waitOrTimeout(t, done)
	require.Equal(t, int64(1), store.blocked.Load(), "all appends returned while Put is still blocked")
	lines, bytes := j.Backlog()
	require.Equal(t, int64(2000), lines)
	require.Equal(t, int64(len(want)+len(rest)), bytes)

	require.NoError(t, l.Close(false))
	close(store.release)
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want)+string(rest), string(mem.joined("acme", "q1")))
}

func TestLargeLinesStoredWhole(t *testing.T) {
	t.Parallel()
	t.Run("On", func(t *testing.T) {
		t.Parallel()
		store := newMemStore()
		cfg := testConfig(t, store)
		cfg.LargeLineBytes = 100
		j := startJournal(t, cfg)
		l, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		small, exact, big := line(1, 50), line(2, 100), line(3, 5000)
		for i, ln := range [][]byte{small, exact, big} {
			require.NoError(t, l.Append(uint64(i+1), ln))
		}
		require.NoError(t, l.Close(false))
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		v, ok := store.get(storage.LineKey("acme", "q1", 3))
		require.True(t, ok)
		require.Equal(t, string(big), string(v), "the raw line, no newline")
		require.Equal(t, []string{storage.LineKey("acme", "q1", 3)}, store.keys(storage.QueryPrefix("acme", "q1")+"lines/"))
		require.Equal(t, string(small)+"\n"+string(exact)+"\n"+string(big)+"\n", string(store.joined("acme", "q1")),
			"the chunk holds the large line too")
	})
	t.Run("Off", func(t *testing.T) {
		t.Parallel()
		store := newMemStore()
		cfg := testConfig(t, store)
		cfg.LargeLineBytes = -1
		j := startJournal(t, cfg)
		l, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		want := appendLines(t, l, 1, 1, 3<<20)
		require.NoError(t, l.Close(false))
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Empty(t, store.keys(storage.QueryPrefix("acme", "q1")+"lines/"))
		require.Equal(t, string(want), string(store.joined("acme", "q1")), "a line over ChunkBytes is a chunk of its own")
	})
}

func TestFinalCloseAssemblesOnceAfterAllChunks(t *testing.T) {
	t.Parallel()
	type testBundle struct {
		store     *memStore
		j         *Journal
		calls     atomic.Int64
		mu        sync.Mutex
		seen      [][]byte // what assembly saw
		failFirst bool
	}
	setup := func(t *testing.T, failFirst bool) *testBundle {
		t.Helper()
		b := &testBundle{store: newMemStore(), failFirst: failFirst}
		cfg := testConfig(t, b.store)
		cfg.ChunkBytes = 300
		cfg.AssembleFunc = func(ctx context.Context, tenant, id string) error {
			n := b.calls.Add(1)
			b.mu.Lock()
			b.seen = append(b.seen, b.store.joined(tenant, id))
			b.mu.Unlock()
			if b.failFirst && n == 1 {
				return storage.ErrUnavailable
			}
			return b.store.assemble(ctx, tenant, id)
		}
		b.j = startJournal(t, cfg)
		return b
	}

	t.Run("Once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		l, err := b.j.Open("acme", "q1", 1)
		require.NoError(t, err)
		want := appendLines(t, l, 1, 40, 50)
		require.NoError(t, l.Close(true))
		require.NoError(t, b.j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, int64(1), b.calls.Load())
		require.Equal(t, string(want), string(b.seen[0]), "every chunk was persisted before assembly")
		tr, ok := b.store.get(storage.TranscriptKey("acme", "q1"))
		require.True(t, ok)
		require.Equal(t, string(want), string(tr))
	})
	t.Run("RetriedOnError", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true)
		l, err := b.j.Open("acme", "q1", 1)
		require.NoError(t, err)
		want := appendLines(t, l, 1, 5, 50)
		require.NoError(t, l.Close(true))
		require.NoError(t, b.j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, int64(2), b.calls.Load())
		tr, _ := b.store.get(storage.TranscriptKey("acme", "q1"))
		require.Equal(t, string(want), string(tr))
	})
	t.Run("WaitsForEarlierAttempt", func(t *testing.T) {
		t.Parallel()
		mem := newMemStore()
		gate := newBlockingStore(mem)
		var seen []byte
		var calls atomic.Int64
		cfg := testConfig(t, storeFunc(func(ctx context.Context, key string, v []byte) error {
			if strings.Contains(key, ".000001.") { // attempt 1's chunks wait for the gate
				return gate.Put(ctx, key, v)
			}
			return mem.Put(ctx, key, v)
		}))
		cfg.AssembleFunc = func(_ context.Context, tenant, id string) error {
			calls.Add(1)
			seen = mem.joined(tenant, id)
			return nil
		}
		j := startJournal(t, cfg)
		l1, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		want := appendLines(t, l1, 1, 3, 40)
		require.NoError(t, l1.Close(false)) // handed back
		waitOrTimeout(t, gate.entered)

		l2, err := j.Open("acme", "q1", 2)
		require.NoError(t, err)
		want = append(want, appendLines(t, l2, 4, 6, 40)...)
		require.NoError(t, l2.Close(true))
		eventually(t, func() bool { _, ok := mem.get(storage.ChunkKey("acme", "q1", 4, 2)); return ok }, "attempt 2 flushed")
		require.Zero(t, calls.Load(), "no assembly while attempt 1 is not persisted")
		close(gate.release)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
		require.Equal(t, int64(1), calls.Load())
		require.Equal(t, string(want), string(seen))
	})
}

func TestFinalRefusesToAssembleWithoutEarlierAttempt(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	var assembled atomic.Int64
	cfg := testConfig(t, storeFunc(func(ctx context.Context, key string, v []byte) error {
		if strings.Contains(key, ".000001.") {
			return storage.ErrInvalidKey // attempt 1 gives up
		}
		return mem.Put(ctx, key, v)
	}))
	cfg.AssembleFunc = func(context.Context, string, string) error { assembled.Add(1); return nil }
	j := startJournal(t, cfg)
	l1, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	appendLines(t, l1, 1, 2, 20)
	require.NoError(t, l1.Close(false))
	l2, err := j.Open("acme", "q1", 2)
	require.NoError(t, err)
	appendLines(t, l2, 3, 4, 20)
	require.NoError(t, l2.Close(true))
	err = j.WaitPersisted(testCtx(t), "acme", "q1")
	require.ErrorIs(t, err, ErrNotPersisted)
	require.ErrorIs(t, err, storage.ErrInvalidKey)
	require.ErrorContains(t, err, "earlier attempt 1")
	require.Zero(t, assembled.Load(), "a transcript missing attempt 1 is never assembled")
}

func TestStopCutsBackoffShort(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	failed := make(chan struct{})
	var calls atomic.Int64
	cfg := testConfig(t, storeFunc(func(ctx context.Context, key string, v []byte) error {
		if calls.Add(1) == 1 {
			close(failed)
			return storage.ErrUnavailable
		}
		return mem.Put(ctx, key, v)
	}))
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour
	cfg.Test.SleepFunc = sleepCtx // the real one: an hour-long backoff
	j, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j.Start(t.Context()))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 3, 20)
	require.NoError(t, l.Close(false))
	waitOrTimeout(t, failed)
	require.NoError(t, j.Stop(testCtx(t)), "Stop retries at once instead of waiting out the backoff")
	require.Equal(t, string(want), string(mem.joined("acme", "q1")))
}

// storeFunc adapts a function to Store.
type storeFunc func(ctx context.Context, key string, value []byte) error

func (f storeFunc) Put(ctx context.Context, key string, value []byte) error {
	return f(ctx, key, value)
}

func TestWaitPersisted(t *testing.T) {
	t.Parallel()
	t.Run("NoLogs", func(t *testing.T) {
		t.Parallel()
		j := startJournal(t, testConfig(t, newMemStore()))
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "nothing"))
	})
	t.Run("OpenLogNotWaitedFor", func(t *testing.T) {
		t.Parallel()
		j := startJournal(t, testConfig(t, newMemStore()))
		l, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		appendLines(t, l, 1, 2, 10)
		require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	})
	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		store := newFlaky(newMemStore())
		store.setDown(true)
		cfg := testConfig(t, store)
		cfg.Test.SleepFunc = store.sleep
		j := startJournal(t, cfg)
		l, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		appendLines(t, l, 1, 2, 10)
		require.NoError(t, l.Close(false))
		waitOrTimeout(t, store.failed)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err = j.WaitPersisted(ctx, "acme", "q1")
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "acme/q1")
	})
	t.Run("PermanentError", func(t *testing.T) {
		t.Parallel()
		var puts atomic.Int64
		cfg := testConfig(t, storeFunc(func(context.Context, string, []byte) error {
			puts.Add(1)
			return fmt.Errorf("backend says: %w", storage.ErrTooLarge)
		}))
		j := startJournal(t, cfg)
		l, err := j.Open("acme", "q1", 1)
		require.NoError(t, err)
		appendLines(t, l, 1, 2, 10)
		require.NoError(t, l.Close(true))
		err = j.WaitPersisted(testCtx(t), "acme", "q1")
		require.ErrorIs(t, err, ErrNotPersisted)
		require.ErrorIs(t, err, storage.ErrTooLarge)
		require.Equal(t, int64(1), puts.Load(), "a permanent error is not retried")
		require.Equal(t, []string{"acme/q1/1.state", "acme/q1/1.wal"}, dirFiles(t, j.cfg.Dir), "files kept for the next start")
	})
}

func TestStopWithStorageDown(t *testing.T) {
	t.Parallel()
	mem := newMemStore()
	store := newFlaky(mem)
	store.setDown(true)
	cfg := testConfig(t, store)
	cfg.Test.SleepFunc = store.sleep
	var assembled atomic.Int64
	cfg.AssembleFunc = func(ctx context.Context, tenant, id string) error {
		assembled.Add(1)
		return mem.assemble(ctx, tenant, id)
	}
	j, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j.Start(t.Context()))
	l, err := j.Open("acme", "q1", 3)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 10, 30)
	require.NoError(t, l.Close(true))
	waitOrTimeout(t, store.failed)

	ctx, cancel := context.WithCancel(t.Context())
	cancel() // no time left for the last attempt
	err = j.Stop(ctx)
	require.ErrorIs(t, err, ErrNotPersisted)
	require.ErrorContains(t, err, "acme/q1 attempt 3: 10 lines")
	require.ErrorIs(t, j.Stop(ctx), ErrNotPersisted, "a second Stop returns the same result")
	waitOrTimeout(t, j.Stopped())
	require.ErrorIs(t, l.Append(11, []byte("x")), ErrClosed)
	require.Equal(t, []string{"acme/q1/3.state", "acme/q1/3.wal"}, dirFiles(t, cfg.Dir))
	require.Empty(t, mem.chunks("acme", "q1"))

	// The next process recovers and persists everything.
	store.setDown(false)
	cfg.Logger = testLogger(t)
	j2 := startJournal(t, cfg)
	require.NoError(t, j2.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, string(want), string(mem.joined("acme", "q1")))
	require.Equal(t, int64(1), assembled.Load(), "recovered final log assembled once")
	require.Empty(t, dirFiles(t, cfg.Dir))
}

func TestStopFlushesOpenLogs(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	cfg := testConfig(t, store) // nothing flushes before Stop: big chunks, frozen clock
	j, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j.Start(t.Context()))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 5, 30)
	require.NoError(t, j.Stop(testCtx(t)))
	require.Equal(t, string(want), string(store.joined("acme", "q1")))
	require.ErrorIs(t, l.Append(6, []byte("late")), ErrStopped)
	require.Equal(t, []string{"acme/q1/1.state", "acme/q1/1.wal"}, dirFiles(t, cfg.Dir),
		"an open log keeps its files; the next Start removes them")

	j2 := startJournal(t, cfg)
	require.NoError(t, j2.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Empty(t, dirFiles(t, cfg.Dir))
	store.requireIdempotent(t)
}

func TestAppendSeqMustIncrease(t *testing.T) {
	t.Parallel()
	j := startJournal(t, testConfig(t, newMemStore()))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	require.ErrorIs(t, l.Append(0, []byte("zero")), ErrSeqOrder, "seqs start at 1")
	require.NoError(t, l.Append(5, []byte("five")))
	for _, seq := range []uint64{5, 4, 1} {
		err := l.Append(seq, []byte("again"))
		require.ErrorIs(t, err, ErrSeqOrder, "seq %d", seq)
		require.ErrorContains(t, err, "acme/q1 attempt 1 seq")
	}
	require.NoError(t, l.Append(9, []byte("nine")))
	lines, _ := j.Backlog()
	require.Equal(t, int64(2), lines, "rejected appends record nothing")
}

func TestAppendAndCloseErrors(t *testing.T) {
	t.Parallel()
	j := startJournal(t, testConfig(t, newMemStore()))
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	require.ErrorIs(t, l.Append(1, []byte("a\nb")), ErrInvalidLine)
	require.NoError(t, l.Append(1, []byte("ok")))
	require.NoError(t, l.Close(false))
	require.ErrorIs(t, l.Append(2, []byte("late")), ErrClosed)
	require.ErrorIs(t, l.Close(true), ErrClosed)
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newMemStore())
	j, err := New(cfg)
	require.NoError(t, err)
	_, err = j.Open("acme", "q1", 1)
	require.ErrorIs(t, err, ErrNotStarted)
	require.NoError(t, j.Start(t.Context()))
	waitOrTimeout(t, j.Started())
	require.ErrorIs(t, j.Start(t.Context()), ErrAlreadyStarted, "a second Start is refused, as by every service")

	for _, tc := range []struct {
		tenant, id string
		attempt    int
	}{
		{"", "q", 1}, {"acme", "", 1}, {"..", "q", 1}, {"acme", ".", 1}, {"a/b", "q", 1},
		{"acme", "q 1", 1}, {"acme", strings.Repeat("x", 129), 1}, {"acme", "q", -1}, {"acme", "q", 1000000},
	} {
		_, err := j.Open(tc.tenant, tc.id, tc.attempt)
		require.ErrorIs(t, err, ErrInvalidID, "%q %q %d", tc.tenant, tc.id, tc.attempt)
	}
	_, err = j.Open("acme", "q1", 1)
	require.NoError(t, err)
	_, err = j.Open("acme", "q1", 1)
	require.ErrorIs(t, err, ErrExists)
	_, err = j.Open("acme", "q1", 2)
	require.NoError(t, err, "another attempt of the same query")

	require.NoError(t, j.Stop(t.Context()))
	_, err = j.Open("acme", "q2", 1)
	require.ErrorIs(t, err, ErrStopped)
	require.ErrorIs(t, j.Start(t.Context()), ErrStopped)
	require.ErrorIs(t, j.Start(t.Context()), startstop.ErrStopped, "the fleet's shared answer")

	// A Stop before Start stops the journal for good, as it does every
	// service: it is not started afterwards.
	j2, err := New(testConfig(t, newMemStore()))
	require.NoError(t, err)
	require.NoError(t, j2.Stop(t.Context()), "Stop before Start")
	waitOrTimeout(t, j2.Stopped())
	require.ErrorIs(t, j2.Start(t.Context()), ErrStopped)
	_, err = j2.Open("acme", "q1", 1)
	require.ErrorIs(t, err, ErrStopped)
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	lo, hi := 100*time.Millisecond, 30*time.Second
	for n, ceiling := range []time.Duration{lo, 2 * lo, 4 * lo, 8 * lo} {
		for range 50 {
			d := backoff(lo, hi, n)
			require.GreaterOrEqual(t, d, ceiling/2, "retry %d", n)
			require.LessOrEqual(t, d, ceiling, "retry %d", n)
		}
	}
	for range 50 {
		d := backoff(lo, hi, 1000)
		require.GreaterOrEqual(t, d, hi/2)
		require.LessOrEqual(t, d, hi)
	}
}

func TestCloseRecordsFlagsInStateFile(t *testing.T) {
	t.Parallel()
	store := newBlockingStore(newMemStore())
	cfg := testConfig(t, store)
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	appendLines(t, l, 1, 2, 10)
	require.NoError(t, l.Close(true))
	waitOrTimeout(t, store.entered) // the flusher is stuck: files are still there
	st, found, err := readStateFile(filepath.Join(cfg.Dir, "acme", "q1", "1.state"))
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, st.Closed)
	require.True(t, st.Final)
	require.Equal(t, &seqRange{First: 1, Last: 2}, st.Pending, "the chunk is recorded before its Put")
	close(store.release)
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	_, err = os.Stat(filepath.Join(cfg.Dir, "acme"))
	require.True(t, errors.Is(err, os.ErrNotExist), "empty query directories are removed")
}

func TestStartLocksDir(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newMemStore())
	j1, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j1.Start(t.Context()))
	j2, err := New(cfg)
	require.NoError(t, err)
	require.ErrorContains(t, j2.Start(t.Context()), "another worker")
	require.NoError(t, j1.Stop(t.Context()))
	require.NoError(t, j2.Start(t.Context()), "the lock is released by Stop")
	require.NoError(t, j2.Stop(t.Context()))
}

func TestNonFinalLogCallsNonFinalFuncAfterItsChunks(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	cfg := testConfig(t, store)
	cfg.ChunkBytes = 300
	var finalCalls, nonFinal atomic.Int64
	var seen []byte
	cfg.AssembleFunc = func(context.Context, string, string) error { finalCalls.Add(1); return nil }
	cfg.NonFinalFunc = func(_ context.Context, tenant, id string) error {
		nonFinal.Add(1)
		seen = store.joined(tenant, id)
		return nil
	}
	j := startJournal(t, cfg)
	l, err := j.Open("acme", "q1", 1)
	require.NoError(t, err)
	want := appendLines(t, l, 1, 30, 50)
	require.NoError(t, l.Close(false))
	require.NoError(t, j.WaitPersisted(testCtx(t), "acme", "q1"))
	require.Equal(t, int64(1), nonFinal.Load(), "called once the handed-back log is persisted")
	require.Zero(t, finalCalls.Load(), "a non-final log is never assembled")
	require.Equal(t, string(want), string(seen), "called only after every chunk is persisted")
}
