package journal

import (
	"bytes"
	"context"
	"io/fs"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// memStore is a tiny in-memory Store that records every Put.
type memStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	puts    []putCall
	changed chan struct{} // receives (non-blocking) after every Put
}

type putCall struct {
	key   string
	value []byte
}

func newMemStore() *memStore {
	return &memStore{objects: map[string][]byte{}, changed: make(chan struct{}, 1)}
}

func (s *memStore) Put(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	v := bytes.Clone(value)
	s.mu.Lock()
	s.objects[key] = v
	s.puts = append(s.puts, putCall{key: key, value: v})
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

func (s *memStore) get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.objects[key]
	return v, ok
}

func (s *memStore) keys(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objects {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (s *memStore) putCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.puts)
}

// chunks returns the query's chunk objects in key order.
func (s *memStore) chunks(tenant, id string) []string {
	return s.keys(storage.ChunkPrefix(tenant, id))
}

// joined concatenates the query's chunks in key order (what assembly does).
func (s *memStore) joined(tenant, id string) []byte {
	var b []byte
	for _, k := range s.chunks(tenant, id) {
		v, _ := s.get(k)
		b = append(b, v...)
	}
	return b
}

// assemble is a test AssembleFunc writing the transcript object.
func (s *memStore) assemble(ctx context.Context, tenant, id string) error {
	return s.Put(ctx, storage.TranscriptKey(tenant, id), s.joined(tenant, id))
}

// requireIdempotent fails when one key was put with different contents.
func (s *memStore) requireIdempotent(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	first := map[string][]byte{}
	for _, p := range s.puts {
		if prev, ok := first[p.key]; ok {
			require.Equal(t, string(prev), string(p.value), "key %s put twice with different bytes", p.key)
		}
		first[p.key] = p.value
	}
}

// flaky wraps a Store and fails every Put with storage.ErrUnavailable while
// down. Its sleep (a Config.Test.SleepFunc) waits until the store is up.
type flaky struct {
	inner    Store
	mu       sync.Mutex
	down     bool
	up       chan struct{} // closed while up
	failures atomic.Int64
	failed   chan struct{} // receives (non-blocking) after every failed Put
	mu2      sync.Mutex
	backoffs []time.Duration
}

func newFlaky(inner Store) *flaky {
	up := make(chan struct{})
	close(up)
	return &flaky{inner: inner, up: up, failed: make(chan struct{}, 1)}
}

func (f *flaky) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if down == f.down {
		return
	}
	f.down = down
	if down {
		f.up = make(chan struct{})
	} else {
		close(f.up)
	}
}

func (f *flaky) Put(ctx context.Context, key string, value []byte) error {
	f.mu.Lock()
	down := f.down
	f.mu.Unlock()
	if down {
		f.failures.Add(1)
		select {
		case f.failed <- struct{}{}:
		default:
		}
		return storage.ErrUnavailable
	}
	return f.inner.Put(ctx, key, value)
}

func (f *flaky) sleep(ctx context.Context, d time.Duration) error {
	f.mu2.Lock()
	f.backoffs = append(f.backoffs, d)
	f.mu2.Unlock()
	f.mu.Lock()
	up := f.up
	f.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// blockingStore blocks every Put until release is closed (or ctx ends).
type blockingStore struct {
	inner   Store
	entered chan string // the key of every Put as it starts
	release chan struct{}
	blocked atomic.Int64 // Puts currently waiting
}

func newBlockingStore(inner Store) *blockingStore {
	return &blockingStore{inner: inner, entered: make(chan string, 1024), release: make(chan struct{})}
}

func (b *blockingStore) Put(ctx context.Context, key string, value []byte) error {
	b.blocked.Add(1)
	defer b.blocked.Add(-1)
	select {
	case b.entered <- key:
	default:
	}
	select {
	case <-b.release:
		return b.inner.Put(ctx, key, value)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fakeClock drives FlushInterval: NowFunc and NewTimerFunc read it, Advance
// fires the timers that are due.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	created chan time.Duration // receives (non-blocking) the duration of every new timer
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), created: make(chan time.Duration, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	t := &fakeTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	c.mu.Unlock()
	select {
	case c.created <- d:
	default:
	}
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		n := len(c.timers)
		c.timers = slices.DeleteFunc(c.timers, func(x *fakeTimer) bool { return x == t })
		return len(c.timers) < n
	}
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool {
		if c.now.Before(t.at) {
			return false
		}
		t.c <- c.now
		return true
	})
}

// armed is the number of pending timers.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// noSleep is a SleepFunc for tests that expect no retry.
func noSleep(ctx context.Context, _ time.Duration) error {
	runtime.Gosched()
	return ctx.Err()
}

func testLogger(t *testing.T) *zerolog.Logger {
	l := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	return &l
}

// testConfig returns a config writing to a fresh directory, with a never
// firing clock (tests that need FlushInterval pass their own fakeClock).
func testConfig(t *testing.T, store Store) Config {
	clock := newFakeClock()
	return Config{
		Dir:    t.TempDir(),
		Store:  store,
		Logger: testLogger(t),
		Test:   TestConfig{SleepFunc: noSleep, NowFunc: clock.Now, NewTimerFunc: clock.NewTimer},
	}
}

// startJournal creates and starts a journal, stopped at cleanup.
func startJournal(t *testing.T, cfg Config) *Journal {
	t.Helper()
	j, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, j.Start(t.Context()))
	t.Cleanup(func() {
		// Tests assert persistence themselves; at cleanup, give up at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = j.Stop(ctx)
	})
	return j
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitOrTimeout[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		require.FailNow(t, "timed out waiting on channel")
	}
	var zero T
	return zero
}

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 2*time.Millisecond, msg)
}

// line returns a deterministic JSON line for seq, padded to size bytes (or
// as short as it can be).
func line(seq uint64, size int) []byte {
	b := []byte(`{"seq":` + strconv.FormatUint(seq, 10) + `,"pad":"`)
	for len(b) < size-2 {
		b = append(b, 'a'+byte(seq%26))
	}
	return append(b, '"', '}')
}

// appendLines appends seqs from..to with lines of size bytes and returns
// the expected transcript bytes.
func appendLines(t *testing.T, l *Log, from, to uint64, size int) []byte {
	t.Helper()
	var want []byte
	for s := from; s <= to; s++ {
		ln := line(s, size)
		require.NoError(t, l.Append(s, ln))
		want = append(want, ln...)
		want = append(want, '\n')
	}
	return want
}

// dirFiles lists the regular files under dir, except the lock and
// reserve files.
func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && path != filepath.Join(dir, lockFile) && path != filepath.Join(dir, reserveFile) {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return out
}
