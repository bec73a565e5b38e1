package storagetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Features declares what a backend can do, so Exercise checks each backend
// against what it promises and nothing more.
type Features struct {
	// MaxValueBytes is the largest value the suite writes with Put (the
	// 1 MiB round trip and the streamed object are cut to it). 0 = no limit.
	MaxValueBytes int
	// TooLargeBytes, when > 0, is a value size the backend must refuse with
	// an error wrapping storage.ErrTooLarge.
	TooLargeBytes int
	// NonAtomicCreate says Create is check-then-write, so two concurrent
	// Creates of one key may both succeed; the race subtest is skipped.
	NonAtomicCreate bool
	// EventualList says List may lag behind writes (Workers KV); list
	// assertions then poll for up to ListSettle.
	EventualList bool
	// ListSettle bounds the polling of EventualList (default 90s).
	ListSettle time.Duration
	// Concurrency is the number of goroutines of the concurrency subtest
	// (default 16; lower it for rate-limited remote backends).
	Concurrency int
}

// DefaultLargeBytes is the size of the large Put round trip (1 MiB).
const DefaultLargeBytes = 1 << 20

// StreamBytes is the size of the streamed object (3 MiB and a bit, so it
// spans several S3 parts and NATS chunks and ends mid-chunk).
const StreamBytes = 3<<20 + 17

// Exercise runs the shared Store suite. newStore returns a fresh store for
// one subtest; it should register its own cleanup (Close must be safe to
// call twice, because the Close subtest closes its store too). Every subtest
// keeps its keys under its own random prefix, so newStore may hand out
// stores that share one bucket or namespace.
//
// Creator and StreamPutter subtests run when the store implements them.
func Exercise(t *testing.T, newStore func(t *testing.T) storage.Store, f Features) {
	t.Helper()
	if f.Concurrency <= 0 {
		f.Concurrency = 16
	}
	if f.ListSettle <= 0 {
		f.ListSettle = 90 * time.Second
	}
	type bundle struct {
		s  storage.Store
		ns string // this subtest's key prefix, ending in '/'
	}
	setup := func(t *testing.T) bundle {
		t.Helper()
		s := newStore(t)
		require.NotNil(t, s, "newStore returned nil")
		return bundle{s: s, ns: "x/" + randName() + "/"}
	}
	limit := func(n int) int {
		if f.MaxValueBytes > 0 && n > f.MaxValueBytes {
			return f.MaxValueBytes
		}
		return n
	}

	t.Run("RoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		cases := map[string][]byte{
			"every-byte": all,
			"random":     randBytes(4096 + 3),
			"empty":      {},
			"newlines":   []byte("{\"a\":1}\n{\"b\":2}\n\n"),
			"large":      randBytes(limit(DefaultLargeBytes)),
		}
		for name, v := range cases {
			key := b.ns + name
			require.NoError(t, b.s.Put(ctx, key, v), "Put %s", name)
			requireValue(t, b.s, key, v)
		}
		// The caller may reuse its slice after Put: the store must have copied it.
		v := []byte("original")
		require.NoError(t, b.s.Put(ctx, b.ns+"copy", v))
		copy(v, "XXXXXXXX")
		requireValue(t, b.s, b.ns+"copy", []byte("original"))
	})

	t.Run("PutBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		require.NoError(t, b.s.Put(ctx, b.ns+"batch/0", []byte("old")))
		var objs []storage.Object
		for i := range 5 {
			objs = append(objs, storage.Object{Key: fmt.Sprintf("%sbatch/%d", b.ns, i), Value: randBytes(100 + i)})
		}
		require.NoError(t, storage.PutBatch(ctx, b.s, objs))
		for _, o := range objs {
			requireValue(t, b.s, o.Key, o.Value)
		}
	})

	t.Run("Overwrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		key := b.ns + "k"
		require.NoError(t, b.s.Put(ctx, key, []byte("a much longer first value")))
		require.NoError(t, b.s.Put(ctx, key, []byte("short")))
		requireValue(t, b.s, key, []byte("short"))
		require.NoError(t, b.s.Put(ctx, key, nil))
		requireValue(t, b.s, key, []byte{})
		requireList(t, f, b.s, b.ns, []string{key})
	})

	t.Run("GetMissing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.s.Get(t.Context(), b.ns+"missing")
		require.ErrorIs(t, err, storage.ErrNotFound)
		// A prefix of an existing key is not itself a key.
		require.NoError(t, b.s.Put(t.Context(), b.ns+"dir/file", []byte("v")))
		_, err = b.s.Get(t.Context(), b.ns+"dir")
		require.ErrorIs(t, err, storage.ErrNotFound)
	})

	t.Run("Delete", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		key := b.ns + "d/k"
		require.NoError(t, b.s.Delete(ctx, key), "deleting a missing key is not an error")
		require.NoError(t, b.s.Put(ctx, key, []byte("v")))
		require.NoError(t, b.s.Put(ctx, b.ns+"d/keep", []byte("w")))
		require.NoError(t, b.s.Delete(ctx, key))
		_, err := b.s.Get(ctx, key)
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.NoError(t, b.s.Delete(ctx, key), "second Delete")
		requireList(t, f, b.s, b.ns, []string{b.ns + "d/keep"})
		requireValue(t, b.s, b.ns+"d/keep", []byte("w"))
		// A deleted key can be written again.
		require.NoError(t, b.s.Put(ctx, key, []byte("again")))
		requireValue(t, b.s, key, []byte("again"))
	})

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		p := b.ns
		keys := []string{
			p + "a/c",
			p + "a/bc/x",
			p + "a/b/y/z",
			p + "a/b.txt",
			p + "a/b/x",
			p + "a/b-",
			p + "b",
		}
		for _, k := range keys {
			require.NoError(t, b.s.Put(ctx, k, []byte(k)))
		}
		// Byte order: '-' < '.' < '/' < 'c'.
		all := []string{p + "a/b-", p + "a/b.txt", p + "a/b/x", p + "a/b/y/z", p + "a/bc/x", p + "a/c", p + "b"}
		requireList(t, f, b.s, p, all)
		requireList(t, f, b.s, p+"a/b/", []string{p + "a/b/x", p + "a/b/y/z"})
		requireList(t, f, b.s, p+"a/b", all[:5])
		requireList(t, f, b.s, p+"a/b/x", []string{p + "a/b/x"})
		requireList(t, f, b.s, p+"a/b/y/", []string{p + "a/b/y/z"})
		requireList(t, f, b.s, p+"a/", all[:6])
		requireList(t, f, b.s, p+"nothing/", nil)
		requireList(t, f, b.s, p+"a/b/x/", nil)
		requireList(t, f, b.s, p+"a/zz", nil)
	})

	t.Run("AllowedChars", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		keys := []string{
			b.ns + "a=b/c.d_e-f",
			b.ns + ".lead/trail.",
			b.ns + ".../-/_/=",
			b.ns + "ABCDEFGHIJKLMNOPQRSTUVWXYZ/abcdefghijklmnopqrstuvwxyz/0123456789",
			b.ns + "status/t1/q-1_a.json",
		}
		for _, k := range keys {
			require.NoError(t, storage.ValidateKey(k))
			require.NoError(t, b.s.Put(ctx, k, []byte(k)), "Put %q", k)
		}
		for _, k := range keys {
			requireValue(t, b.s, k, []byte(k))
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		requireList(t, f, b.s, b.ns, want)
	})

	t.Run("LongKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		key := longKey(b.ns, storage.MaxKeyBytes)
		require.Len(t, key, storage.MaxKeyBytes)
		require.NoError(t, b.s.Put(ctx, key, []byte("long")))
		requireValue(t, b.s, key, []byte("long"))
		requireList(t, f, b.s, b.ns, []string{key})
		require.NoError(t, b.s.Delete(ctx, key))
		_, err := b.s.Get(ctx, key)
		require.ErrorIs(t, err, storage.ErrNotFound)

		tooLong := longKey(b.ns, storage.MaxKeyBytes+1)
		require.ErrorIs(t, b.s.Put(ctx, tooLong, []byte("x")), storage.ErrInvalidKey)
		longSeg := b.ns + strings.Repeat("s", storage.MaxSegmentBytes+1)
		require.ErrorIs(t, b.s.Put(ctx, longSeg, []byte("x")), storage.ErrInvalidKey)
		okSeg := b.ns + strings.Repeat("s", storage.MaxSegmentBytes)
		require.NoError(t, b.s.Put(ctx, okSeg, []byte("seg")))
		requireValue(t, b.s, okSeg, []byte("seg"))
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		for _, key := range InvalidKeys() {
			require.ErrorIs(t, storage.ValidateKey(key), storage.ErrInvalidKey, "ValidateKey(%q)", key)
			require.ErrorIs(t, b.s.Put(ctx, key, []byte("v")), storage.ErrInvalidKey, "Put(%q)", key)
			_, err := b.s.Get(ctx, key)
			require.ErrorIs(t, err, storage.ErrInvalidKey, "Get(%q)", key)
			require.ErrorIs(t, b.s.Delete(ctx, key), storage.ErrInvalidKey, "Delete(%q)", key)
			if c, ok := b.s.(storage.Creator); ok {
				require.ErrorIs(t, c.Create(ctx, key, []byte("v")), storage.ErrInvalidKey, "Create(%q)", key)
			}
			if sp, ok := b.s.(storage.StreamPutter); ok {
				require.ErrorIs(t, sp.PutStream(ctx, key, strings.NewReader("v")), storage.ErrInvalidKey, "PutStream(%q)", key)
			}
		}
	})

	t.Run("Create", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, ok := b.s.(storage.Creator)
		if !ok {
			t.Skip("store does not implement storage.Creator")
		}
		ctx := t.Context()
		key := b.ns + "once"
		require.NoError(t, c.Create(ctx, key, []byte("first")))
		requireValue(t, b.s, key, []byte("first"))
		require.ErrorIs(t, c.Create(ctx, key, []byte("second")), storage.ErrExists)
		requireValue(t, b.s, key, []byte("first"))
		require.NoError(t, b.s.Delete(ctx, key))
		require.NoError(t, c.Create(ctx, key, []byte("third")), "Create after Delete")
		requireValue(t, b.s, key, []byte("third"))
		require.NoError(t, c.Create(ctx, b.ns+"empty", nil))
		requireValue(t, b.s, b.ns+"empty", []byte{})
	})

	t.Run("CreateRace", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, ok := b.s.(storage.Creator)
		if !ok {
			t.Skip("store does not implement storage.Creator")
		}
		if f.NonAtomicCreate {
			t.Skip("Features.NonAtomicCreate: Create is check-then-write")
		}
		ctx := t.Context()
		key := b.ns + "race"
		n := f.Concurrency
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = c.Create(ctx, key, fmt.Appendf(nil, "writer-%d", i)) })
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "two Creates of one key succeeded (%d and %d)", winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, err, storage.ErrExists, "writer %d", i)
		}
		require.NotEqual(t, -1, winner, "no Create succeeded")
		requireValue(t, b.s, key, fmt.Appendf(nil, "writer-%d", winner))
	})

	t.Run("PutStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sp, ok := b.s.(storage.StreamPutter)
		if !ok {
			t.Skip("store does not implement storage.StreamPutter")
		}
		ctx := t.Context()
		want := randBytes(limit(StreamBytes))
		key := b.ns + "big.ndjson"
		require.NoError(t, sp.PutStream(ctx, key, &oddReader{r: bytes.NewReader(want)}))
		requireValue(t, b.s, key, want)

		// Overwrite with a small stream, then an empty one.
		require.NoError(t, sp.PutStream(ctx, key, strings.NewReader("small")))
		requireValue(t, b.s, key, []byte("small"))
		require.NoError(t, sp.PutStream(ctx, b.ns+"empty", strings.NewReader("")))
		requireValue(t, b.s, b.ns+"empty", []byte{})

		// A reader failing half way leaves the previous value in place.
		boom := errors.New("reader broke")
		half := io.MultiReader(bytes.NewReader(randBytes(limit(1<<20))), &errReader{err: boom})
		require.Error(t, sp.PutStream(ctx, key, half))
		requireValue(t, b.s, key, []byte("small"))
		require.Error(t, sp.PutStream(ctx, b.ns+"never", io.MultiReader(strings.NewReader("part"), &errReader{err: boom})))
		_, err := b.s.Get(ctx, b.ns+"never")
		require.ErrorIs(t, err, storage.ErrNotFound, "a failed PutStream must not leave a partial object")
		requireList(t, f, b.s, b.ns, []string{key, b.ns + "empty"})
	})

	t.Run("TooLarge", func(t *testing.T) {
		t.Parallel()
		if f.TooLargeBytes <= 0 {
			t.Skip("Features.TooLargeBytes not set: the backend has no value size limit")
		}
		b := setup(t)
		err := b.s.Put(t.Context(), b.ns+"big", make([]byte, f.TooLargeBytes))
		require.ErrorIs(t, err, storage.ErrTooLarge)
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := t.Context()
		const perWorker = 8
		var wg sync.WaitGroup
		errs := make(chan error, f.Concurrency*perWorker)
		for w := range f.Concurrency {
			wg.Go(func() {
				for i := range perWorker {
					key := fmt.Sprintf("%sw%03d/k%03d", b.ns, w, i)
					if err := b.s.Put(ctx, key, []byte(key)); err != nil {
						errs <- fmt.Errorf("put %s: %w", key, err)
						continue
					}
					got, err := b.s.Get(ctx, key)
					if err != nil {
						errs <- fmt.Errorf("get %s: %w", key, err)
					} else if string(got) != key {
						errs <- fmt.Errorf("get %s: got %q", key, got)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := make([]string, 0, f.Concurrency*perWorker)
		for w := range f.Concurrency {
			for i := range perWorker {
				want = append(want, fmt.Sprintf("%sw%03d/k%03d", b.ns, w, i))
			}
		}
		requireList(t, f, b.s, b.ns, want)
	})

	t.Run("CancelledContext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		key := b.ns + "k"
		require.Error(t, b.s.Put(ctx, key, []byte("v")), "Put")
		_, err := b.s.Get(ctx, key)
		require.Error(t, err, "Get")
		_, err = b.s.List(ctx, b.ns)
		require.Error(t, err, "List")
		require.Error(t, b.s.Delete(ctx, key), "Delete")
		if c, ok := b.s.(storage.Creator); ok {
			require.Error(t, c.Create(ctx, key, []byte("v")), "Create")
		}
		if sp, ok := b.s.(storage.StreamPutter); ok {
			require.Error(t, sp.PutStream(ctx, key, strings.NewReader("v")), "PutStream")
		}
		_, err = b.s.Get(t.Context(), key)
		require.ErrorIs(t, err, storage.ErrNotFound, "a write with a cancelled context must not happen")
	})

	t.Run("Close", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.s.Put(t.Context(), b.ns+"k", []byte("v")))
		require.NoError(t, b.s.Close())
	})
}

// InvalidKeys returns keys every backend must refuse with storage.ErrInvalidKey.
func InvalidKeys() []string {
	return []string{
		"", "/x", "x/", "a//b", "/", "a/../b", "a/./b", "..", ".", "../x", "x/..",
		"a b", "ü", "a\x00b", "a\nb", "a*b", "a>b", "a\\b", "a:b", "a%2Fb", "a+b",
		strings.Repeat("k", storage.MaxKeyBytes+1),
	}
}

// requireValue asserts that key holds exactly want.
func requireValue(t *testing.T, s storage.Store, key string, want []byte) {
	t.Helper()
	got, err := s.Get(t.Context(), key)
	require.NoError(t, err, "Get %q", key)
	require.Equal(t, len(want), len(got), "Get %q: length", key)
	require.True(t, bytes.Equal(want, got), "Get %q: value differs", key)
}

// requireList asserts that List(prefix) returns exactly want, in order.
func requireList(t *testing.T, f Features, s storage.Store, prefix string, want []string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	var got []string
	deadline := time.Now().Add(f.ListSettle)
	for {
		var err error
		got, err = s.List(t.Context(), prefix)
		require.NoError(t, err, "List %q", prefix)
		if got == nil {
			got = []string{}
		}
		if !f.EventualList || slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("List %q: %v", prefix, t.Context().Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	require.Equal(t, want, got, "List %q", prefix)
}

// longKey returns a valid key of exactly n bytes starting with prefix.
func longKey(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for rest := n - len(prefix); rest > 0; {
		if rest <= 200 {
			b.WriteString(strings.Repeat("k", rest))
			break
		}
		seg := min(200, rest-2) // leave at least one byte for the next segment
		b.WriteString(strings.Repeat("k", seg) + "/")
		rest -= seg + 1
	}
	return b.String()
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func randName() string {
	return fmt.Sprintf("%x", randBytes(6))
}

// oddReader returns data in awkward read sizes.
type oddReader struct {
	r io.Reader
	n int
}

func (o *oddReader) Read(p []byte) (int, error) {
	o.n++
	size := []int{1, 7, 4093, 65537, 100000}[o.n%5]
	if len(p) > size {
		p = p[:size]
	}
	return o.r.Read(p)
}

type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) { return 0, e.err }
