package storage_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// plainStore hides the optional interfaces of the store it wraps, so the
// non-streaming path of AssembleTranscript is tested too.
type plainStore struct{ storage.Store }

// stores returns the stores the transcript and status helpers are tested on.
func stores() map[string]func(t *testing.T) storage.Store {
	return map[string]func(t *testing.T) storage.Store{
		"Mem":   func(*testing.T) storage.Store { return storagetest.NewMem() },
		"FS":    func(t *testing.T) storage.Store { return newFS(t) },
		"Plain": func(*testing.T) storage.Store { return plainStore{storagetest.NewMem()} },
	}
}

func forEachStore(t *testing.T, fn func(t *testing.T, s storage.Store)) {
	t.Helper()
	for name, mk := range stores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, mk(t))
		})
	}
}

const tenant, qid = "acme", "q-1"

func putChunk(t *testing.T, s storage.Store, first uint64, attempt int, lines ...string) {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	require.NoError(t, s.Put(t.Context(), storage.ChunkKey(tenant, qid, first, attempt), []byte(b.String())))
}

func transcript(t *testing.T, s storage.Store) string {
	t.Helper()
	b, err := s.Get(t.Context(), storage.TranscriptKey(tenant, qid))
	require.NoError(t, err)
	return string(b)
}

func TestAssembleOrdersLinesBySeq(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		// Put out of order, with a gap (seq 6) and seqs past 9 (key order
		// must be numeric: %020d).
		putChunk(t, s, 10, 1, `{"n":10}`, `{"n":11}`)
		putChunk(t, s, 1, 1, `{"n":1}`, `{"n":2}`, `{"n":3}`)
		putChunk(t, s, 7, 1, `{"n":7}`, `{"n":8}`, `{"n":9}`)
		putChunk(t, s, 4, 1, `{"n":4}`, `{"n":5}`)
		require.NoError(t, storage.AssembleTranscript(t.Context(), s, tenant, qid))
		require.Equal(t, lines(1, 2, 3, 4, 5, 7, 8, 9, 10, 11), transcript(t, s))
	})
}

func TestAssembleHigherAttemptWinsASeq(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		// Attempt 1 wrote seqs 1..5; attempt 2 restarted at seq 4 and went on
		// to 7; attempt 1's late chunk 6..8 arrived after that.
		putChunk(t, s, 1, 1, "a1-1", "a1-2", "a1-3", "a1-4", "a1-5")
		putChunk(t, s, 4, 2, "a2-4", "a2-5", "a2-6", "a2-7")
		putChunk(t, s, 6, 1, "a1-6", "a1-7", "a1-8")
		require.NoError(t, storage.AssembleTranscript(t.Context(), s, tenant, qid))
		require.Equal(t, "a1-1\na1-2\na1-3\na2-4\na2-5\na2-6\na2-7\na1-8\n", transcript(t, s))
	})
}

func TestAssembleKeepsChunksAndReassemblesLateChunks(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		ctx := t.Context()
		putChunk(t, s, 3, 2, "a2-3", "a2-4")
		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid))
		require.Equal(t, "a2-3\na2-4\n", transcript(t, s))
		keys, err := s.List(ctx, storage.ChunkPrefix(tenant, qid))
		require.NoError(t, err)
		require.Len(t, keys, 1, "chunks are kept after assembly")

		// A crashed worker's attempt 1 is flushed late.
		putChunk(t, s, 1, 1, "a1-1", "a1-2", "a1-3")
		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid))
		require.Equal(t, "a1-1\na1-2\na2-3\na2-4\n", transcript(t, s))
		// Idempotent.
		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid))
		require.Equal(t, "a1-1\na1-2\na2-3\na2-4\n", transcript(t, s))
	})
}

func TestAssembleWithoutChunks(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		ctx := t.Context()
		require.ErrorIs(t, storage.AssembleTranscript(ctx, s, tenant, qid), storage.ErrNotFound)
		require.NoError(t, s.Put(ctx, storage.TranscriptKey(tenant, qid), []byte("kept\n")))
		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid), "an existing transcript without chunks is left alone")
		require.Equal(t, "kept\n", transcript(t, s))
	})
}

func TestAssembleHandlesOddChunks(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		ctx := t.Context()
		// A chunk whose last line lacks "\n" still counts it as a line; an
		// empty chunk holds no line; empty lines are lines.
		require.NoError(t, s.Put(ctx, storage.ChunkKey(tenant, qid, 1, 1), []byte("one\n\nthree")))
		require.NoError(t, s.Put(ctx, storage.ChunkKey(tenant, qid, 4, 1), nil))
		putChunk(t, s, 4, 1, "four")
		require.NoError(t, s.Put(ctx, storage.ChunkKey(tenant, qid, 9, 1), []byte{}))
		// Objects under chunks/ that are not chunk keys are ignored.
		require.NoError(t, s.Put(ctx, storage.ChunkPrefix(tenant, qid)+"README", []byte("x\n")))
		require.NoError(t, s.Put(ctx, storage.ChunkPrefix(tenant, qid)+"sub/00000000000000000001.000001.ndjson", []byte("x\n")))
		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid))
		require.Equal(t, "one\n\nthree\nfour\n", transcript(t, s))
	})
}

func TestAssembleStreamsLargeTranscripts(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		var want strings.Builder
		seq := uint64(1)
		for c := range 40 {
			var chunkLines []string
			for i := range 500 {
				l := fmt.Sprintf(`{"chunk":%d,"i":%d,"pad":"%s"}`, c, i, strings.Repeat("x", 200))
				chunkLines = append(chunkLines, l)
				want.WriteString(l + "\n")
			}
			putChunk(t, s, seq, 1, chunkLines...)
			seq += 500
		}
		require.NoError(t, storage.AssembleTranscript(t.Context(), s, tenant, qid))
		got := transcript(t, s)
		require.Equal(t, len(want.String()), len(got))
		require.True(t, want.String() == got)
	})
}

func TestAssembleFailureKeepsPreviousTranscript(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, inner storage.Store) {
		ctx := t.Context()
		putChunk(t, inner, 1, 1, "one")
		require.NoError(t, storage.AssembleTranscript(ctx, inner, tenant, qid))
		putChunk(t, inner, 2, 1, "two")

		// Reading a chunk fails half way through the transcript.
		failGet := withStreaming(&failOnGet{Store: inner, key: storage.ChunkKey(tenant, qid, 2, 1)})
		require.ErrorIs(t, storage.AssembleTranscript(ctx, failGet, tenant, qid), storage.ErrUnavailable)
		require.Equal(t, "one\n", transcript(t, inner))

		// Writing the transcript fails.
		f := storagetest.NewFlaky(inner)
		f.SetDown(true)
		failPut := withStreaming(&failOnPut{Store: inner, f: f})
		require.ErrorIs(t, storage.AssembleTranscript(ctx, failPut, tenant, qid), storage.ErrUnavailable)
		require.Equal(t, "one\n", transcript(t, inner))

		require.NoError(t, storage.AssembleTranscript(ctx, inner, tenant, qid))
		require.Equal(t, "one\ntwo\n", transcript(t, inner))
	})
}

// failOnGet fails Get of one key with ErrUnavailable.
type failOnGet struct {
	storage.Store
	key string
}

func (s *failOnGet) Get(ctx context.Context, key string) ([]byte, error) {
	if key == s.key {
		return nil, fmt.Errorf("get %s: %w", key, storage.ErrUnavailable)
	}
	return s.Store.Get(ctx, key)
}

// failOnPut reads from Store and writes through the Flaky f.
type failOnPut struct {
	storage.Store
	f *storagetest.Flaky
}

func (s *failOnPut) Put(ctx context.Context, key string, v []byte) error { return s.f.Put(ctx, key, v) }

// streaming adds PutStream to a wrapper whose inner store has it.
type streaming struct {
	storage.Store
	sp storage.StreamPutter
}

func (s streaming) PutStream(ctx context.Context, key string, r io.Reader) error {
	return s.sp.PutStream(ctx, key, r)
}

// withStreaming gives w a PutStream when the store it wraps has one: through
// the Flaky for failOnPut, straight to the inner store otherwise.
func withStreaming(w storage.Store) storage.Store {
	switch w := w.(type) {
	case *failOnPut:
		if _, ok := w.Store.(storage.StreamPutter); ok {
			return streaming{Store: w, sp: w.f}
		}
	case *failOnGet:
		if sp, ok := w.Store.(storage.StreamPutter); ok {
			return streaming{Store: w, sp: sp}
		}
	}
	return w
}

func TestAssembleRejectsBadIdentity(t *testing.T) {
	t.Parallel()
	s := storagetest.NewMem()
	require.ErrorIs(t, storage.AssembleTranscript(t.Context(), s, "Bad Tenant", "q"), storage.ErrInvalidKey)
	_, err := storage.ReadTranscript(t.Context(), s, "t", "../x")
	require.ErrorIs(t, err, storage.ErrInvalidKey)
}

func TestReadTranscript(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, s storage.Store) {
		ctx := t.Context()
		_, err := storage.ReadTranscript(ctx, s, tenant, qid)
		require.ErrorIs(t, err, storage.ErrNotFound)

		putChunk(t, s, 1, 1, "one", "two")
		got, err := storage.ReadTranscript(ctx, s, tenant, qid)
		require.NoError(t, err)
		require.Equal(t, "one\ntwo\n", string(got), "assembled on the fly")
		_, err = s.Get(ctx, storage.TranscriptKey(tenant, qid))
		require.ErrorIs(t, err, storage.ErrNotFound, "reading writes nothing")

		require.NoError(t, storage.AssembleTranscript(ctx, s, tenant, qid))
		got, err = storage.ReadTranscript(ctx, s, tenant, qid)
		require.NoError(t, err)
		require.Equal(t, "one\ntwo\n", string(got))
	})
}

func TestParseChunkKey(t *testing.T) {
	t.Parallel()
	first, attempt, err := storage.ParseChunkKey(storage.ChunkKey("t", "q", 18446744073709551615, 999999))
	require.NoError(t, err)
	require.Equal(t, uint64(18446744073709551615), first)
	require.Equal(t, 999999, attempt)
	first, attempt, err = storage.ParseChunkKey("00000000000000000042.000003.ndjson")
	require.NoError(t, err)
	require.Equal(t, uint64(42), first)
	require.Equal(t, 3, attempt)
	for _, bad := range []string{
		"", "x.ndjson", "1.ndjson", "1.2.json", ".1.ndjson", "1..ndjson", "a.1.ndjson", "1.b.ndjson",
		"-1.1.ndjson", "1.-1.ndjson", "+1.1.ndjson", "18446744073709551616.1.ndjson", "1.1.2.ndjson",
		"123456789012345678901.1.ndjson", "1.1234567890.ndjson",
	} {
		_, _, err := storage.ParseChunkKey(bad)
		require.ErrorIs(t, err, storage.ErrInvalidKey, "%q", bad)
	}
}

func FuzzParseChunkKey(f *testing.F) {
	for _, s := range []string{"00000000000000000001.000001.ndjson", "1.1.ndjson", "x", "1.1.ndjson.ndjson", "99999999999999999999.1.ndjson"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		first, attempt, err := storage.ParseChunkKey(name)
		if err != nil {
			return
		}
		require.GreaterOrEqual(t, attempt, 0)
		if attempt <= 999999 {
			// What parses round-trips through ChunkKey to the same numbers.
			f2, a2, err := storage.ParseChunkKey(storage.ChunkKey("t", "q", first, attempt))
			require.NoError(t, err)
			require.Equal(t, first, f2)
			require.Equal(t, attempt, a2)
		}
	})
}

// FuzzAssemble compares the streaming assembly with a naive reference: for
// each seq, the line of the highest attempt (first chunk in key order on a
// tie). spec describes chunks, three bytes each; raw is the content of one
// extra chunk at seq 1, attempt 1, as a damaged writer might leave it.
func FuzzAssemble(f *testing.F) {
	f.Add([]byte{0, 0, 3, 2, 1, 4, 5, 2, 2}, "x\ny")
	f.Add([]byte{1, 1, 1, 1, 1, 1}, "")
	f.Add([]byte{19, 2, 4, 0, 0, 0}, "\n\n")
	f.Fuzz(func(t *testing.T, spec []byte, raw string) {
		if len(spec) > 60 {
			spec = spec[:60]
		}
		s := storagetest.NewMem()
		ctx := context.Background()
		type ref struct {
			first   uint64
			attempt int
		}
		contents := map[ref]string{}
		if raw != "" || len(spec) == 0 {
			contents[ref{1, 1}] = raw
		}
		for i := 0; i+2 < len(spec); i += 3 {
			r := ref{uint64(spec[i]%20) + 1, int(spec[i+1]%3) + 1}
			var b strings.Builder
			for k := range int(spec[i+2] % 5) {
				fmt.Fprintf(&b, "s%d-a%d-i%d-c%d\n", r.first+uint64(k), r.attempt, k, i)
			}
			contents[r] = b.String() // a later chunk with the same key replaces the earlier
		}
		refs := make([]ref, 0, len(contents))
		for r, c := range contents {
			require.NoError(t, s.Put(ctx, storage.ChunkKey(tenant, qid, r.first, r.attempt), []byte(c)))
			refs = append(refs, r)
		}
		slices.SortFunc(refs, func(a, b ref) int {
			if a.first != b.first {
				return int(a.first) - int(b.first)
			}
			return a.attempt - b.attempt
		})
		type pick struct {
			attempt int
			line    string
		}
		bySeq := map[uint64]pick{}
		for _, r := range refs {
			c := contents[r]
			parts := strings.SplitAfter(c, "\n")
			if parts[len(parts)-1] == "" {
				parts = parts[:len(parts)-1]
			}
			for k, line := range parts {
				if !strings.HasSuffix(line, "\n") {
					line += "\n"
				}
				seq := r.first + uint64(k)
				if p, ok := bySeq[seq]; !ok || r.attempt > p.attempt {
					bySeq[seq] = pick{r.attempt, line}
				}
			}
		}
		seqs := slices.Sorted(func(yield func(uint64) bool) {
			for k := range bySeq {
				if !yield(k) {
					return
				}
			}
		})
		var want strings.Builder
		for _, seq := range seqs {
			want.WriteString(bySeq[seq].line)
		}
		got, err := storage.ReadTranscript(ctx, s, tenant, qid)
		if len(contents) == 0 {
			require.ErrorIs(t, err, storage.ErrNotFound)
			return
		}
		require.NoError(t, err)
		require.Equal(t, want.String(), string(got))
	})
}

func lines(ns ...int) string {
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "{\"n\":%d}\n", n)
	}
	return b.String()
}

func TestReassembleIfAssembled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := storagetest.NewMem()
	// No transcript yet: nothing is written.
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 1, 1), []byte("a\n")))
	require.NoError(t, storage.ReassembleIfAssembled(ctx, s, "t", "q"))
	_, err := s.Get(ctx, storage.TranscriptKey("t", "q"))
	require.ErrorIs(t, err, storage.ErrNotFound)
	// Assembled by attempt 2; then attempt 1's late chunk arrives.
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 3, 2), []byte("c\n")))
	require.NoError(t, storage.AssembleTranscript(ctx, s, "t", "q"))
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 2, 1), []byte("b\n")))
	require.NoError(t, storage.ReassembleIfAssembled(ctx, s, "t", "q"))
	got, err := s.Get(ctx, storage.TranscriptKey("t", "q"))
	require.NoError(t, err)
	require.Equal(t, "a\nb\nc\n", string(got))
}
