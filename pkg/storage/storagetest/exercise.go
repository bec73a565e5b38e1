package storagetest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"slices"
	"strings"
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
	x := &suite{f: f, newStore: newStore}
	for _, c := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"RoundTrip", x.roundTrip},
		{"PutBatch", x.putBatch},
		{"Overwrite", x.overwrite},
		{"GetMissing", x.getMissing},
		{"Delete", x.deleteKey},
		{"List", x.list},
		{"AllowedChars", x.allowedChars},
		{"LongKeys", x.longKeys},
		{"InvalidKeys", x.invalidKeys},
		{"Create", x.create},
		{"CreateRace", x.createRace},
		{"PutStream", x.putStream},
		{"TooLarge", x.tooLarge},
		{"Concurrent", x.concurrent},
		{"CancelledContext", x.cancelledContext},
		{"Close", x.closeStore},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

// suite is one run of Exercise: the backend's features and how to get a
// fresh store. Each subtest is one of its methods.
type suite struct {
	f        Features
	newStore func(t *testing.T) storage.Store
}

// bundle is one subtest's store and key prefix.
type bundle struct {
	s  storage.Store
	ns string // this subtest's key prefix, ending in '/'
}

func (x *suite) setup(t *testing.T) bundle {
	t.Helper()
	s := x.newStore(t)
	require.NotNil(t, s, "newStore returned nil")
	return bundle{s: s, ns: "x/" + randName() + "/"}
}

// limit cuts a value size to Features.MaxValueBytes.
func (x *suite) limit(n int) int {
	if x.f.MaxValueBytes > 0 && n > x.f.MaxValueBytes {
		return x.f.MaxValueBytes
	}
	return n
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
