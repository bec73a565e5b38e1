package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// The subtests of Exercise, in the order it runs them.

func (x *suite) roundTrip(t *testing.T) {
	b := x.setup(t)
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
		"large":      randBytes(x.limit(DefaultLargeBytes)),
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
}

func (x *suite) putBatch(t *testing.T) {
	b := x.setup(t)
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
}

func (x *suite) overwrite(t *testing.T) {
	b := x.setup(t)
	ctx := t.Context()
	key := b.ns + "k"
	require.NoError(t, b.s.Put(ctx, key, []byte("a much longer first value")))
	require.NoError(t, b.s.Put(ctx, key, []byte("short")))
	requireValue(t, b.s, key, []byte("short"))
	require.NoError(t, b.s.Put(ctx, key, nil))
	requireValue(t, b.s, key, []byte{})
	requireList(t, x.f, b.s, b.ns, []string{key})
}

func (x *suite) getMissing(t *testing.T) {
	b := x.setup(t)
	_, err := b.s.Get(t.Context(), b.ns+"missing")
	require.ErrorIs(t, err, storage.ErrNotFound)
	// A prefix of an existing key is not itself a key.
	require.NoError(t, b.s.Put(t.Context(), b.ns+"dir/file", []byte("v")))
	_, err = b.s.Get(t.Context(), b.ns+"dir")
	require.ErrorIs(t, err, storage.ErrNotFound)
}

func (x *suite) deleteKey(t *testing.T) {
	b := x.setup(t)
	ctx := t.Context()
	key := b.ns + "d/k"
	require.NoError(t, b.s.Delete(ctx, key), "deleting a missing key is not an error")
	require.NoError(t, b.s.Put(ctx, key, []byte("v")))
	require.NoError(t, b.s.Put(ctx, b.ns+"d/keep", []byte("w")))
	require.NoError(t, b.s.Delete(ctx, key))
	_, err := b.s.Get(ctx, key)
	require.ErrorIs(t, err, storage.ErrNotFound)
	require.NoError(t, b.s.Delete(ctx, key), "second Delete")
	requireList(t, x.f, b.s, b.ns, []string{b.ns + "d/keep"})
	requireValue(t, b.s, b.ns+"d/keep", []byte("w"))
	// A deleted key can be written again.
	require.NoError(t, b.s.Put(ctx, key, []byte("again")))
	requireValue(t, b.s, key, []byte("again"))
}

func (x *suite) list(t *testing.T) {
	b := x.setup(t)
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
	requireList(t, x.f, b.s, p, all)
	requireList(t, x.f, b.s, p+"a/b/", []string{p + "a/b/x", p + "a/b/y/z"})
	requireList(t, x.f, b.s, p+"a/b", all[:5])
	requireList(t, x.f, b.s, p+"a/b/x", []string{p + "a/b/x"})
	requireList(t, x.f, b.s, p+"a/b/y/", []string{p + "a/b/y/z"})
	requireList(t, x.f, b.s, p+"a/", all[:6])
	requireList(t, x.f, b.s, p+"nothing/", nil)
	requireList(t, x.f, b.s, p+"a/b/x/", nil)
	requireList(t, x.f, b.s, p+"a/zz", nil)
}

func (x *suite) allowedChars(t *testing.T) {
	b := x.setup(t)
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
	requireList(t, x.f, b.s, b.ns, want)
}

func (x *suite) longKeys(t *testing.T) {
	b := x.setup(t)
	ctx := t.Context()
	key := longKey(b.ns, storage.MaxKeyBytes)
	require.Len(t, key, storage.MaxKeyBytes)
	require.NoError(t, b.s.Put(ctx, key, []byte("long")))
	requireValue(t, b.s, key, []byte("long"))
	requireList(t, x.f, b.s, b.ns, []string{key})
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
}

func (x *suite) invalidKeys(t *testing.T) {
	b := x.setup(t)
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
}

func (x *suite) create(t *testing.T) {
	b := x.setup(t)
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
}

func (x *suite) createRace(t *testing.T) {
	b := x.setup(t)
	c, ok := b.s.(storage.Creator)
	if !ok {
		t.Skip("store does not implement storage.Creator")
	}
	if x.f.NonAtomicCreate {
		t.Skip("Features.NonAtomicCreate: Create is check-then-write")
	}
	ctx := t.Context()
	key := b.ns + "race"
	n := x.f.Concurrency
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
}

func (x *suite) putStream(t *testing.T) {
	b := x.setup(t)
	sp, ok := b.s.(storage.StreamPutter)
	if !ok {
		t.Skip("store does not implement storage.StreamPutter")
	}
	ctx := t.Context()
	want := randBytes(x.limit(StreamBytes))
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
	half := io.MultiReader(bytes.NewReader(randBytes(x.limit(1<<20))), &errReader{err: boom})
	require.Error(t, sp.PutStream(ctx, key, half))
	requireValue(t, b.s, key, []byte("small"))
	require.Error(t, sp.PutStream(ctx, b.ns+"never", io.MultiReader(strings.NewReader("part"), &errReader{err: boom})))
	_, err := b.s.Get(ctx, b.ns+"never")
	require.ErrorIs(t, err, storage.ErrNotFound, "a failed PutStream must not leave a partial object")
	requireList(t, x.f, b.s, b.ns, []string{key, b.ns + "empty"})
}

func (x *suite) tooLarge(t *testing.T) {
	if x.f.TooLargeBytes <= 0 {
		t.Skip("Features.TooLargeBytes not set: the backend has no value size limit")
	}
	b := x.setup(t)
	err := b.s.Put(t.Context(), b.ns+"big", make([]byte, x.f.TooLargeBytes))
	require.ErrorIs(t, err, storage.ErrTooLarge)
}

func (x *suite) concurrent(t *testing.T) {
	b := x.setup(t)
	ctx := t.Context()
	const perWorker = 8
	var wg sync.WaitGroup
	errs := make(chan error, x.f.Concurrency*perWorker)
	for w := range x.f.Concurrency {
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
	want := make([]string, 0, x.f.Concurrency*perWorker)
	for w := range x.f.Concurrency {
		for i := range perWorker {
			want = append(want, fmt.Sprintf("%sw%03d/k%03d", b.ns, w, i))
		}
	}
	requireList(t, x.f, b.s, b.ns, want)
}

func (x *suite) cancelledContext(t *testing.T) {
	b := x.setup(t)
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
}

func (x *suite) closeStore(t *testing.T) {
	b := x.setup(t)
	require.NoError(t, b.s.Put(t.Context(), b.ns+"k", []byte("v")))
	require.NoError(t, b.s.Close())
}
