package cfkv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cloudflare "github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/kv"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/cfkv/kvfake"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testAccount = "0123456789abcdef0123456789abcdef"
	testNS      = "fedcba9876543210fedcba9876543210"
	testToken   = "test-token-not-a-secret"
)

type bundle struct {
	fake *kvfake.Server
	srv  *httptest.Server
}

// newFake starts a KV fake behind an httptest server.
func newFake(t *testing.T, mutate func(*kvfake.Server)) *bundle {
	t.Helper()
	f := kvfake.New(testToken, testAccount, testNS)
	if mutate != nil {
		mutate(f)
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return &bundle{fake: f, srv: srv}
}

// config returns a Config for the fake with fast, test-friendly retries.
func (b *bundle) config(t *testing.T) Config {
	t.Helper()
	logger := zerolog.New(zerolog.NewTestWriter(t))
	return Config{
		AccountID:   testAccount,
		NamespaceID: testNS,
		Token:       testToken,
		Endpoint:    b.srv.URL + "/client/v4/",
		HTTPClient:  b.srv.Client(),
		MaxBackoff:  20 * time.Millisecond,
		Logger:      &logger,
	}
}

// store returns a Store on the fake, closed at cleanup.
func (b *bundle) store(t *testing.T, mutate func(*Config)) *Store {
	t.Helper()
	cfg := b.config(t)
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recv waits for one value on ch.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting on a channel")
		var zero T
		return zero
	}
}

func TestExercise(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) { f.WriteInterval = 10 * time.Millisecond })
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		return b.store(t, func(c *Config) {
			c.KeyWriteInterval = 20 * time.Millisecond
			c.Budget = 1_000_000
			c.Burst = 1000
		})
	}, storagetest.Features{TooLargeBytes: MaxValueBytes + 1})
	t.Cleanup(func() {
		st := b.fake.Stats()
		require.Zero(t, st.KeyRateLimited, "the coalescer must never make the fake refuse a write")
		require.Zero(t, st.BudgetLimited)
	})
}

func TestPutStoresTheBytesAsTheyAre(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, nil)
	values := map[string][]byte{
		"status/t1/json.json":  []byte(`{"value":"looks like the SDK envelope"}`),
		"status/t1/binary":     randBytes(t, 3000),
		"status/t1/empty.json": {},
	}
	for k, v := range values {
		require.NoError(t, s.Put(t.Context(), k, v))
	}
	for k, v := range values {
		raw, ok := b.fake.Value(k)
		require.True(t, ok, k)
		require.True(t, bytes.Equal(v, raw), "the fake holds other bytes for %s", k)
		got, err := s.Get(t.Context(), k)
		require.NoError(t, err)
		require.True(t, bytes.Equal(v, got), "Get %s", k)
	}
}

// TestSDKDefaultUpdateWouldStoreJSON shows why Put overrides the request
// body: cloudflare-go v4's Values.Update, used as generated, sends its
// params as JSON and the API (the fake stores what it receives, as KV does)
// keeps that JSON as the value (cloudflare-go#3911).
func TestSDKDefaultUpdateWouldStoreJSON(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, nil)
	key := "status/t1/q1.json"
	_, err := s.nsvc.Values.Update(t.Context(), testNS, escapeKey(key), kv.NamespaceValueUpdateParams{
		AccountID: cloudflare.F(testAccount),
		Value:     cloudflare.F("hello"),
	})
	require.NoError(t, err)
	raw, ok := b.fake.Value(key)
	require.True(t, ok)
	require.NotEqual(t, "hello", string(raw))
	var env map[string]any
	require.NoError(t, json.Unmarshal(raw, &env), "the stored value is the SDK's JSON: %s", raw)
	require.Equal(t, "hello", env["value"])

	// The same write through the Store keeps the bytes.
	require.NoError(t, s.Put(t.Context(), "status/t1/q2.json", []byte("hello")))
	raw, ok = b.fake.Value("status/t1/q2.json")
	require.True(t, ok)
	require.Equal(t, "hello", string(raw))
}

func TestKeysAreOnePathSegment(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, nil)
	key := storage.StatusKey("tenant-a", "q=1.x")
	require.NoError(t, s.Put(t.Context(), key, []byte("v")))
	_, ok := b.fake.Value(key)
	require.True(t, ok, "the fake unescaped %%2F back to '/'")

	// Unescaped, cloudflare-go would send three segments: no route.
	res, err := s.nsvc.Values.Get(t.Context(), testNS, key, kv.NamespaceValueGetParams{AccountID: cloudflare.F(testAccount)})
	if res != nil {
		_ = res.Body.Close()
	}
	var cfErr *cloudflare.Error
	require.ErrorAs(t, err, &cfErr)
	require.Equal(t, http.StatusNotFound, cfErr.StatusCode)
	require.Equal(t, int64(kvfake.CodeNoRoute), cfErr.Errors[0].Code)
}

func TestBurstToOneKeyIsCoalesced(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil) // Cloudflare's 1 write per second per key
	var mu sync.Mutex
	var order []string
	s := b.store(t, nil) // default KeyWriteInterval
	s.w.mu.Lock()
	s.w.onEnqueue = func(_ string, _ bool, v []byte) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, string(v))
	}
	s.w.mu.Unlock()

	const n = 50
	key := storage.StatusKey("t1", "burst")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = s.Put(t.Context(), key, fmt.Appendf(nil, "state-%02d", i)) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "put %d", i)
	}
	mu.Lock()
	last := order[len(order)-1]
	mu.Unlock()
	got, ok := b.fake.Value(key)
	require.True(t, ok)
	require.Equal(t, last, string(got), "the last value accepted must be the one stored")
	require.Zero(t, b.fake.Stats().KeyRateLimited, "no write may be refused with 429")
	writes := b.fake.Writes(key)
	require.GreaterOrEqual(t, writes, 1)
	require.Less(t, writes, n, "writes must have been coalesced")
}

// gate makes the fake hold the first request it gets: held is closed when
// that request has arrived, and open releases it. Register open with
// t.Cleanup after creating the store, so it runs before the store's Close.
func gate(f *kvfake.Server) (held <-chan struct{}, open func()) {
	release := make(chan struct{})
	arrived := make(chan struct{})
	var first atomic.Bool
	f.Inject = func(*http.Request) int {
		if first.CompareAndSwap(false, true) {
			close(arrived)
			<-release
		}
		return 0
	}
	var once sync.Once
	return arrived, func() { once.Do(func() { close(release) }) }
}

// enqueued counts the ops the store's coalescer accepted.
func enqueued(s *Store) *atomic.Int64 {
	var n atomic.Int64
	s.w.mu.Lock()
	s.w.onEnqueue = func(string, bool, []byte) { n.Add(1) }
	s.w.mu.Unlock()
	return &n
}

func TestKeysPendingTogetherShareABulkWrite(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	held, open := gate(b.fake)
	s := b.store(t, nil)
	t.Cleanup(open)
	n := enqueued(s)

	// The first Put's request is held by the fake while the others queue.
	const keys = 40
	values := make([][]byte, keys)
	errs := make([]error, keys)
	var wg sync.WaitGroup
	for i := range keys {
		values[i] = randBytes(t, 100+i)
		wg.Go(func() { errs[i] = s.Put(t.Context(), fmt.Sprintf("status/t/k%02d", i), values[i]) })
		if i == 0 {
			recv(t, held)
		}
	}
	waitFor(t, "all puts queued", func() bool { return n.Load() == keys })
	open()
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "put %d", i)
	}
	for i := range keys {
		raw, ok := b.fake.Value(fmt.Sprintf("status/t/k%02d", i))
		require.True(t, ok)
		require.True(t, bytes.Equal(values[i], raw), "key %d", i)
	}
	st := b.fake.Stats()
	require.Equal(t, 1, st.Requests[kvfake.RoutePutValue], "only the first Put went alone")
	require.Equal(t, 1, st.Requests[kvfake.RouteBulkPut], "the other 39 went in one bulk write")
}

func TestUnsuccessfulBulkKeysAreRetried(t *testing.T) {
	t.Parallel()
	var refused atomic.Int64
	b := newFake(t, func(f *kvfake.Server) {
		f.WriteInterval = 10 * time.Millisecond
		f.BulkUnsuccessful = func(key string) bool {
			return key == "s/b" && refused.Add(1) == 1
		}
	})
	held, open := gate(b.fake)
	s := b.store(t, func(c *Config) { c.KeyWriteInterval = 20 * time.Millisecond })
	t.Cleanup(open)
	n := enqueued(s)
	var wg sync.WaitGroup
	errs := make(map[string]error)
	var mu sync.Mutex
	for _, k := range []string{"s/first", "s/a", "s/b", "s/c"} {
		wg.Go(func() {
			err := s.Put(t.Context(), k, []byte(k))
			mu.Lock()
			errs[k] = err
			mu.Unlock()
		})
		if k == "s/first" {
			recv(t, held)
		}
	}
	waitFor(t, "all puts queued", func() bool { return n.Load() == 4 })
	open()
	wg.Wait()
	for k, err := range errs {
		require.NoError(t, err, k)
		v, ok := b.fake.Value(k)
		require.True(t, ok, k)
		require.Equal(t, k, string(v))
	}
	require.Equal(t, int64(1), refused.Load(), "s/b was refused in the bulk write")
	require.Equal(t, 1, b.fake.Writes("s/b"), "then written by the retry")
	require.Equal(t, 1, b.fake.Stats().Requests[kvfake.RouteBulkPut])
}

func TestDeleteSupersedesAPendingPut(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) { f.WriteInterval = 10 * time.Millisecond })
	held, open := gate(b.fake)
	s := b.store(t, func(c *Config) { c.KeyWriteInterval = 20 * time.Millisecond })
	t.Cleanup(open)
	n := enqueued(s)
	key := "status/t/q.json"

	first := make(chan error, 1)
	go func() { first <- s.Put(t.Context(), key, []byte("a")) }()
	recv(t, held) // "a" is in flight
	second := make(chan error, 1)
	go func() { second <- s.Put(t.Context(), key, []byte("b")) }()
	waitFor(t, "second put", func() bool { return n.Load() == 2 })
	del := make(chan error, 1)
	go func() { del <- s.Delete(t.Context(), key) }()
	waitFor(t, "delete", func() bool { return n.Load() == 3 })
	open()

	require.NoError(t, recv(t, first))
	require.NoError(t, recv(t, second), "a Put superseded by a later Delete succeeds")
	require.NoError(t, recv(t, del))
	_, ok := b.fake.Value(key)
	require.False(t, ok, "the delete, the latest op, wins")
	require.Equal(t, 2, b.fake.Writes(key), "one PUT of \"a\", then the DELETE; \"b\" never sent")
}

func TestBulkDelete(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	for i := range 5 {
		b.fake.Set(fmt.Sprintf("d/k%d", i), []byte("v"))
	}
	held, open := gate(b.fake)
	s := b.store(t, nil)
	t.Cleanup(open)
	n := enqueued(s)
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range 5 {
		wg.Go(func() { errs[i] = s.Delete(t.Context(), fmt.Sprintf("d/k%d", i)) })
		if i == 0 {
			recv(t, held)
		}
	}
	waitFor(t, "deletes queued", func() bool { return n.Load() == 5 })
	open()
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	keys, err := s.List(t.Context(), "d/")
	require.NoError(t, err)
	require.Empty(t, keys)
	st := b.fake.Stats()
	require.Equal(t, 1, st.Requests[kvfake.RouteDeleteValue])
	require.Equal(t, 1, st.Requests[kvfake.RouteBulkDelete])
}

func TestRequestBudgetKeepsUnderTheAccountLimit(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) {
		f.Budget = 12
		f.BudgetWindow = time.Second
	})
	s := b.store(t, func(c *Config) {
		c.Budget = 10
		c.BudgetWindow = time.Second
		c.Burst = 2
		c.MaxRetries = -1 // a 429 would fail the Get
	})
	b.fake.Set("k", []byte("v"))
	for i := range 20 {
		_, err := s.Get(t.Context(), "k")
		require.NoError(t, err, "get %d", i)
	}
	require.Zero(t, b.fake.Stats().BudgetLimited)
}

func TestFakeBudgetRefusesAnUnthrottledClient(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) {
		f.Budget = 3
		f.BudgetWindow = time.Minute
	})
	s := b.store(t, func(c *Config) {
		c.Budget = 1000
		c.BudgetWindow = time.Second
		c.MaxRetries = -1
	})
	b.fake.Set("k", []byte("v"))
	var err error
	for range 4 {
		if _, err = s.Get(t.Context(), "k"); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, storage.ErrUnavailable)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusTooManyRequests, ae.Status)
	require.Equal(t, kvfake.CodeAccountThrottle, ae.Errors[0].Code)
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) {
		f.Budget = 2
		f.BudgetWindow = time.Second
	})
	s := b.store(t, func(c *Config) {
		c.Budget = 1000
		c.Burst = 100
		c.BudgetWindow = time.Second
		c.MaxRetries = 3
		c.MaxRetryAfter = 5 * time.Second
	})
	b.fake.Set("k", []byte("v"))
	for i := range 3 {
		got, err := s.Get(t.Context(), "k")
		require.NoError(t, err, "get %d", i)
		require.Equal(t, "v", string(got))
	}
	require.Positive(t, b.fake.Stats().BudgetLimited, "the third Get was refused once and waited")
}

func TestServerErrorsAreRetriedThenUnavailable(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	b := newFake(t, func(f *kvfake.Server) {
		f.Inject = func(*http.Request) int {
			if calls.Add(1) <= 2 {
				return http.StatusServiceUnavailable
			}
			return 0
		}
	})
	s := b.store(t, func(c *Config) { c.MaxRetries = 2 })
	require.NoError(t, s.Put(t.Context(), "k", []byte("v")), "two 503s, then success")
	v, ok := b.fake.Value("k")
	require.True(t, ok)
	require.Equal(t, "v", string(v))

	b2 := newFake(t, func(f *kvfake.Server) {
		f.Inject = func(*http.Request) int { return http.StatusBadGateway }
	})
	s2 := b2.store(t, func(c *Config) { c.MaxRetries = 1 })
	_, err := s2.Get(t.Context(), "k")
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.Equal(t, 2, b2.fake.Stats().Requests[kvfake.RouteGetValue], "one try and one retry")
}

func TestWrongTokenFailsWithoutRetry(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, func(c *Config) { c.Token = "wrong" })
	_, err := s.Get(t.Context(), "k")
	require.Error(t, err)
	require.NotErrorIs(t, err, storage.ErrUnavailable)
	require.NotErrorIs(t, err, storage.ErrNotFound)
	var ae *APIError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusForbidden, ae.Status)
	require.Equal(t, 1, b.fake.Stats().Unauthorized)
	require.NotContains(t, err.Error(), "wrong", "the token must not appear in errors")
}

func TestMetadataAndTTL(t *testing.T) {
	t.Parallel()
	b := newFake(t, func(f *kvfake.Server) { f.WriteInterval = 10 * time.Millisecond })
	held, open := gate(b.fake)
	s := b.store(t, func(c *Config) {
		c.KeyWriteInterval = 20 * time.Millisecond
		c.ExpirationTTL = 2 * time.Hour
		c.Metadata = func(key string, value []byte) any {
			if key == "m/huge" {
				return map[string]string{"pad": string(bytes.Repeat([]byte("x"), 2000))}
			}
			return map[string]any{"state": string(value)}
		}
	})
	t.Cleanup(open)
	n := enqueued(s)
	var wg sync.WaitGroup
	keys := []string{"m/single", "m/bulk1", "m/bulk2", "m/huge"}
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() { errs[i] = s.Put(t.Context(), k, []byte("running")) })
		if i == 0 {
			recv(t, held)
		}
	}
	waitFor(t, "all queued", func() bool { return n.Load() == 4 })
	open()
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, keys[i])
	}
	now := time.Now().Unix()
	for _, k := range []string{"m/single", "m/bulk1", "m/bulk2"} {
		meta, ok := b.fake.Metadata(k)
		require.True(t, ok, k)
		require.JSONEq(t, `{"state":"running"}`, string(meta), k)
		exp, _ := b.fake.Expiration(k)
		require.InDelta(t, now+7200, exp, 60, k)
		v, _ := b.fake.Value(k)
		require.Equal(t, "running", string(v), k)
	}
	meta, ok := b.fake.Metadata("m/huge")
	require.True(t, ok)
	require.Nil(t, meta, "metadata over 1024 bytes is dropped, the value kept")
	require.Equal(t, 1, b.fake.Stats().Requests[kvfake.RoutePutValue])
	require.Equal(t, 1, b.fake.Stats().Requests[kvfake.RouteBulkPut])
}

func TestTooLargeValueSendsNothing(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, nil)
	err := s.Put(t.Context(), "big", make([]byte, MaxValueBytes+1))
	require.ErrorIs(t, err, storage.ErrTooLarge)
	require.Empty(t, b.fake.Stats().Requests)
}

func TestListPaginatesWithTheCursor(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	var want []string
	for i := range 25 {
		k := fmt.Sprintf("status/t/q%02d.json", 24-i)
		b.fake.Set(k, []byte("v"))
		want = append([]string{k}, want...)
	}
	b.fake.Set("status/u/other.json", []byte("v"))
	b.fake.Set("status/t/not a key", []byte("v"))
	s := b.store(t, func(c *Config) { c.ListPageSize = 10 })
	got, err := s.List(t.Context(), "status/t/")
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, 3, b.fake.Stats().Requests[kvfake.RouteListKeys])
}

func TestCloseWritesWhatIsPending(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	_, open := gate(b.fake)
	s := b.store(t, nil)
	t.Cleanup(open)
	n := enqueued(s)
	put := make(chan error, 1)
	go func() { put <- s.Put(t.Context(), "k", []byte("v")) }()
	waitFor(t, "put queued", func() bool { return n.Load() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	waitFor(t, "close started", s.w.isClosed)
	require.ErrorIs(t, s.Put(t.Context(), "k2", []byte("v")), ErrClosed)
	open()
	require.NoError(t, recv(t, closed))
	require.NoError(t, recv(t, put))
	v, ok := b.fake.Value("k")
	require.True(t, ok)
	require.Equal(t, "v", string(v))
	require.NoError(t, s.Close(), "a second Close is fine")
	_, err := s.Get(t.Context(), "k")
	require.ErrorIs(t, err, ErrClosed)
}

func TestCloseGivesUpAfterCloseTimeout(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, func(c *Config) {
		c.KeyWriteInterval = time.Hour // the second write of k would wait an hour
		c.CloseTimeout = 50 * time.Millisecond
	})
	require.NoError(t, s.Put(t.Context(), "k", []byte("1")))
	n := enqueued(s)
	put := make(chan error, 1)
	go func() { put <- s.Put(t.Context(), "k", []byte("2")) }()
	waitFor(t, "second put queued", func() bool { return n.Load() == 1 })
	require.ErrorIs(t, s.Close(), ErrClosed)
	require.ErrorIs(t, recv(t, put), ErrClosed)
	v, _ := b.fake.Value("k")
	require.Equal(t, "1", string(v))
}

func TestCancelledPutIsWithdrawn(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	s := b.store(t, func(c *Config) { c.KeyWriteInterval = time.Hour })
	require.NoError(t, s.Put(t.Context(), "k", []byte("1")))
	n := enqueued(s)
	ctx, cancel := context.WithCancel(t.Context())
	put := make(chan error, 1)
	go func() { put <- s.Put(ctx, "k", []byte("2")) }()
	waitFor(t, "second put queued", func() bool { return n.Load() == 1 })
	cancel()
	require.ErrorIs(t, recv(t, put), context.Canceled)
	require.NoError(t, s.Close(), "nothing is left pending")
	require.Equal(t, 1, b.fake.Writes("k"))
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want Config
		err  string
	}{
		{in: "cfkv://acct/ns", want: Config{AccountID: "acct", NamespaceID: "ns"}},
		{
			in:   "cfkv://acct/ns/?endpoint=http%3A%2F%2F127.0.0.1%3A8787%2Fclient%2Fv4%2F&budget=300&ttl=24h",
			want: Config{AccountID: "acct", NamespaceID: "ns", Endpoint: "http://127.0.0.1:8787/client/v4/", Budget: 300, ExpirationTTL: 24 * time.Hour},
		},
		{in: "cfkv://acct", err: "must be cfkv://"},
		{in: "cfkv://acct/ns/extra", err: "must be cfkv://"},
		{in: "cfkv://acct/ns?ttl=10s", err: "ttl"},
		{in: "cfkv://acct/ns?budget=x", err: "budget"},
		{in: "cfkv://acct/ns?token=x", err: "unknown URL parameter"},
		{in: "cfkv://user:pw@acct/ns", err: "credentials do not belong"},
		{in: "s3://b", err: "cfkv scheme"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(c.in)
			require.NoError(t, err)
			got, err := ParseURL(u)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestOpenTakesTheTokenFromTheEnvironment(t *testing.T) {
	t.Parallel()
	b := newFake(t, nil)
	b.fake.Set("status/t/q.json", []byte("v"))
	u, err := url.Parse("cfkv://" + testAccount + "/" + testNS + "?endpoint=" + url.QueryEscape(b.srv.URL+"/client/v4/"))
	require.NoError(t, err)

	_, err = open(t.Context(), u, nil, func(string) string { return "" })
	require.ErrorContains(t, err, TokenEnv)

	st, err := open(t.Context(), u, nil, func(k string) string {
		if k == TokenEnv {
			return testToken
		}
		return ""
	})
	require.NoError(t, err)
	defer st.Close()
	got, err := st.Get(t.Context(), "status/t/q.json")
	require.NoError(t, err)
	require.Equal(t, "v", string(got))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	ok := Config{AccountID: "a", NamespaceID: "n", Token: "t"}
	cases := map[string]struct {
		mutate func(*Config)
		err    string
	}{
		"no account":   {func(c *Config) { c.AccountID = "" }, "AccountID"},
		"bad ns":       {func(c *Config) { c.NamespaceID = "a/b" }, "NamespaceID"},
		"no token":     {func(c *Config) { c.Token = "" }, "Token"},
		"short ttl":    {func(c *Config) { c.ExpirationTTL = time.Second }, "ExpirationTTL"},
		"burst":        {func(c *Config) { c.Budget, c.Burst = 5, 5 }, "Burst"},
		"endpoint":     {func(c *Config) { c.Endpoint = "api.cloudflare.com" }, "Endpoint"},
		"list page":    {func(c *Config) { c.ListPageSize = 5 }, "ListPageSize"},
		"neg interval": {func(c *Config) { c.KeyWriteInterval = -time.Second }, "KeyWriteInterval"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := ok
			c.mutate(&cfg)
			_, err := New(cfg)
			require.ErrorContains(t, err, c.err)
		})
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	resp := func(status int, retryAfter string) *http.Response {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		return &http.Response{StatusCode: status, Header: h, Body: http.NoBody}
	}
	someErr := errors.New("api error")
	cases := []struct {
		status    int
		after     string
		retryable bool
		sentinel  error
		wait      time.Duration
	}{
		{status: 404, sentinel: storage.ErrNotFound},
		{status: 413, sentinel: storage.ErrTooLarge},
		{status: 414, sentinel: storage.ErrInvalidKey},
		{status: 400},
		{status: 403},
		{status: 429, after: "7", retryable: true, sentinel: storage.ErrUnavailable, wait: 7 * time.Second},
		{status: 503, retryable: true, sentinel: storage.ErrUnavailable},
		{status: 409, retryable: true, sentinel: storage.ErrUnavailable},
	}
	for _, c := range cases {
		f := classify(someErr, resp(c.status, c.after)) //nolint:bodyclose // resp's body is http.NoBody
		require.Equal(t, c.retryable, f.retryable, "status %d", c.status)
		require.Equal(t, c.sentinel, f.sentinel, "status %d", c.status)
		if c.after != "" {
			require.True(t, f.hasAfter)
			require.Equal(t, c.wait, f.retryAfter)
		}
	}
	f := classify(&transportError{err: errors.New("reset")}, nil)
	require.True(t, f.retryable)
	f = classify(errors.New("dial tcp: refused"), nil)
	require.True(t, f.retryable)
	require.Equal(t, storage.ErrUnavailable, f.sentinel)
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := map[string]struct {
		want time.Duration
		ok   bool
	}{
		"":                              {0, false},
		"12":                            {12 * time.Second, true},
		"0.5":                           {500 * time.Millisecond, true},
		"-1":                            {0, false},
		"NaN":                           {0, false},
		"soon":                          {0, false},
		"Fri, 02 Jan 2026 03:04:35 GMT": {30 * time.Second, true},
		"Fri, 02 Jan 2026 03:00:00 GMT": {0, true},
	}
	for in, c := range cases {
		got, ok := parseRetryAfter(in, now)
		require.Equal(t, c.ok, ok, "%q", in)
		require.Equal(t, c.want, got, "%q", in)
	}
}

func TestParseEnvelopeErrors(t *testing.T) {
	t.Parallel()
	got := parseEnvelopeErrors([]byte(`{"success":false,"errors":[{"code":10009,"message":"get: 'key not found'"},"junk",{"code":971,"message":"Please wait"}],"messages":[],"result":null}`))
	require.Equal(t, []APIErrorItem{{Code: 10009, Message: "get: 'key not found'"}, {Code: 971, Message: "Please wait"}}, got)
	require.Nil(t, parseEnvelopeErrors([]byte("<html>bad gateway</html>")))
	require.Nil(t, parseEnvelopeErrors(nil))
}

func FuzzParseEnvelopeErrors(f *testing.F) {
	f.Add([]byte(`{"success":false,"errors":[{"code":10009,"message":"key not found"}],"messages":[],"result":null}`))
	f.Add([]byte(`{"errors":[{"code":"x"},{"code":1e99},{}]}`))
	f.Add([]byte(`{"errors":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`<html>`))
	f.Fuzz(func(t *testing.T, body []byte) {
		items := parseEnvelopeErrors(body)
		if len(items) > 16 {
			t.Fatalf("%d items, want at most 16", len(items))
		}
		for _, it := range items {
			if len(it.Message) > 512+len("…") {
				t.Fatalf("message of %d bytes", len(it.Message))
			}
		}
		_ = (&APIError{Status: 500, Errors: items}).Error()
	})
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "1", "120", "1.5", "-3", "1e308", "NaN", "Inf", "Wed, 21 Oct 2015 07:28:00 GMT", "garbage"} {
		f.Add(s)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseRetryAfter(v, now)
		if d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %s, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("parseRetryAfter(%q) = %s but not ok", v, d)
		}
	})
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"cfkv://a/n", "cfkv://a/n?endpoint=http://x/&budget=10&ttl=1m", "cfkv://a", "cfkv:///n",
		"cfkv://a/n/m", "cfkv://a/n?ttl=-1h", "cfkv://u@a/n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		cfg, err := ParseURL(u)
		if err != nil {
			return
		}
		if cfg.AccountID == "" || cfg.NamespaceID == "" {
			t.Fatalf("ParseURL(%q) accepted empty ids: %+v", s, cfg)
		}
		if cfg.ExpirationTTL != 0 && cfg.ExpirationTTL < MinTTL {
			t.Fatalf("ParseURL(%q) accepted ttl %s", s, cfg.ExpirationTTL)
		}
	})
}
