package storage

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ParseChunkKey parses a chunk key made by ChunkKey (or just its last
// segment, "<first seq>.<attempt>.ndjson") into the Fleet-Seq of the chunk's
// first line and the attempt that wrote it.
func ParseChunkKey(key string) (firstSeq uint64, attempt int, err error) {
	name := key[strings.LastIndexByte(key, '/')+1:]
	rest, ok := strings.CutSuffix(name, ".ndjson")
	seqText, attemptText, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || !allDigits(seqText, 20) || !allDigits(attemptText, 9) {
		return 0, 0, fmt.Errorf("storage: %q is not a chunk key <first seq>.<attempt>.ndjson: %w", key, ErrInvalidKey)
	}
	firstSeq, err = strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("storage: chunk key %q: seq: %w", key, ErrInvalidKey)
	}
	a, err := strconv.Atoi(attemptText)
	if err != nil {
		return 0, 0, fmt.Errorf("storage: chunk key %q: attempt: %w", key, ErrInvalidKey)
	}
	return firstSeq, a, nil
}

func allDigits(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// chunkRef is one chunk object found by List.
type chunkRef struct {
	key     string
	first   uint64
	attempt int
}

// listChunks returns a query's chunks ordered by first seq, then attempt.
// Objects under the chunk prefix whose names are not chunk keys are ignored.
func listChunks(ctx context.Context, s Store, tenant, id string) ([]chunkRef, error) {
	keys, err := s.List(ctx, ChunkPrefix(tenant, id))
	if err != nil {
		return nil, fmt.Errorf("list chunks: %w", err)
	}
	refs := make([]chunkRef, 0, len(keys))
	for _, k := range keys {
		first, attempt, err := ParseChunkKey(k)
		if err != nil || strings.Contains(strings.TrimPrefix(k, ChunkPrefix(tenant, id)), "/") {
			continue
		}
		refs = append(refs, chunkRef{key: k, first: first, attempt: attempt})
	}
	slices.SortFunc(refs, func(a, b chunkRef) int {
		return cmp.Or(cmp.Compare(a.first, b.first), cmp.Compare(a.attempt, b.attempt), cmp.Compare(a.key, b.key))
	})
	return refs, nil
}

// chunk is a loaded chunk: line i (Fleet-Seq first+i) is data[offs[i]:offs[i+1]].
type chunk struct {
	chunkRef
	data []byte
	offs []int
}

func (c *chunk) lines() int  { return len(c.offs) - 1 }
func (c *chunk) end() uint64 { return c.first + uint64(c.lines()) }

// splitChunk indexes the lines of a chunk. Every line should end with "\n";
// a last line without one still counts as a line (the newline is added on
// output), so seqs stay aligned even with a damaged chunk.
func splitChunk(ref chunkRef, data []byte) (*chunk, error) {
	offs := []int{0}
	for i, b := range data {
		if b == '\n' {
			offs = append(offs, i+1)
		}
	}
	if offs[len(offs)-1] < len(data) {
		offs = append(offs, len(data))
	}
	c := &chunk{chunkRef: ref, data: data, offs: offs}
	if uint64(c.lines()) > math.MaxUint64-c.first {
		return nil, fmt.Errorf("chunk %s: %d lines from seq %d overflow", ref.key, c.lines(), c.first)
	}
	return c, nil
}

// writeLines writes the query's lines in Fleet-Seq order to w, one chunk
// load at a time. For every seq, the line comes from the chunk of the highest
// attempt that holds it (on a tie, the first chunk in key order).
//
// Chunks are loaded when the seq being written reaches their first seq and
// dropped once it passes their end, so memory holds only the chunks that
// overlap the current seq: one, unless attempts overlap.
func writeLines(ctx context.Context, s Store, refs []chunkRef, w io.Writer) error {
	if len(refs) == 0 {
		return nil
	}
	var open []*chunk
	next := 0
	seq := refs[0].first
	for {
		for next < len(refs) && refs[next].first <= seq {
			data, err := s.Get(ctx, refs[next].key)
			if err != nil {
				return fmt.Errorf("read chunk %s: %w", refs[next].key, err)
			}
			c, err := splitChunk(refs[next], data)
			if err != nil {
				return err
			}
			open = append(open, c)
			next++
		}
		open = slices.DeleteFunc(open, func(c *chunk) bool { return c.end() <= seq })
		if len(open) == 0 {
			if next == len(refs) {
				return nil
			}
			seq = refs[next].first // a gap in the seqs
			continue
		}
		best := open[0]
		for _, c := range open[1:] {
			if c.attempt > best.attempt {
				best = c
			}
		}
		// best wins every seq until it ends or another chunk starts.
		runEnd := best.end()
		if next < len(refs) && refs[next].first < runEnd {
			runEnd = refs[next].first
		}
		from, to := int(seq-best.first), int(runEnd-best.first)
		if _, err := w.Write(best.data[best.offs[from]:best.offs[to]]); err != nil {
			return err
		}
		if to == best.lines() && !bytes.HasSuffix(best.data, []byte("\n")) {
			if _, err := w.Write([]byte("\n")); err != nil {
				return err
			}
		}
		seq = runEnd
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// errAbandoned stops the chunk writer when PutStream gave up reading.
var errAbandoned = errors.New("storage: transcript write abandoned")

// AssembleTranscript writes a query's transcript (TranscriptKey) from its
// journal chunks (under ChunkPrefix): every line, in Fleet-Seq order, each
// ending with "\n".
//
// When two attempts hold a line of the same seq, the higher attempt's line
// wins. A seq is reused only when a newer attempt restarted from what it
// knew while an older, superseded attempt (a worker presumed dead, fenced by
// the retrying status) still wrote lines; the newer attempt's lines are the
// ones subscribers saw last and the ones the run's result follows, so the
// superseded attempt's late lines are left out. Seqs no chunk holds are gaps
// and are skipped.
//
// With a StreamPutter the transcript streams to storage chunk by chunk and is
// never held whole in memory; otherwise it is built in memory and Put.
//
// Chunks are kept after assembly, on purpose: a chunk of an older attempt
// may arrive after the transcript was written (a crashed worker flushes its
// journal when it restarts), and because every chunk is still there,
// assembling again is always exact and idempotent. The cost is that a
// query's lines are stored twice; remove a query's chunks only together, with
// its transcript in place, e.g. by a bucket lifecycle rule on
// queries/*/*/chunks/ (a partial set of chunks would assemble a partial
// transcript over the full one).
//
// A failed assembly leaves any earlier transcript as it was (every Store
// writes a key atomically). With no chunks, an existing transcript is left
// alone and nil is returned; with neither, the error wraps ErrNotFound.
func AssembleTranscript(ctx context.Context, s Store, tenant, id string) error {
	if !protocol.ValidTenant(tenant) || !protocol.ValidID(id) {
		return fmt.Errorf("storage: assemble transcript %q/%q: %w", tenant, id, ErrInvalidKey)
	}
	refs, err := listChunks(ctx, s, tenant, id)
	if err != nil {
		return fmt.Errorf("storage: assemble transcript %s/%s: %w", tenant, id, err)
	}
	key := TranscriptKey(tenant, id)
	if len(refs) == 0 {
		if _, err := s.Get(ctx, key); err != nil {
			return fmt.Errorf("storage: assemble transcript %s/%s: no chunks: %w", tenant, id, err)
		}
		return nil
	}
	if err := putLines(ctx, s, key, refs); err != nil {
		return fmt.Errorf("storage: assemble transcript %s/%s: %w", tenant, id, err)
	}
	return nil
}

func putLines(ctx context.Context, s Store, key string, refs []chunkRef) error {
	sp, ok := s.(StreamPutter)
	if !ok {
		var buf bytes.Buffer
		if err := writeLines(ctx, s, refs, &buf); err != nil {
			return err
		}
		return s.Put(ctx, key, buf.Bytes())
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := writeLines(ctx, s, refs, pw)
		_ = pw.CloseWithError(err) // nil: the reader sees EOF
		done <- err
	}()
	perr := sp.PutStream(ctx, key, pr)
	_ = pr.CloseWithError(errAbandoned) // unblocks the writer if PutStream stopped early
	werr := <-done
	if werr != nil && !errors.Is(werr, errAbandoned) {
		return werr
	}
	if perr != nil {
		return fmt.Errorf("write %s: %w", key, perr)
	}
	return nil
}

// ReadTranscript returns a query's transcript: the assembled object if there
// is one, else the lines assembled on the fly from its chunks (nothing is
// written). With neither, the error wraps ErrNotFound.
func ReadTranscript(ctx context.Context, s Store, tenant, id string) ([]byte, error) {
	if !protocol.ValidTenant(tenant) || !protocol.ValidID(id) {
		return nil, fmt.Errorf("storage: read transcript %q/%q: %w", tenant, id, ErrInvalidKey)
	}
	b, err := s.Get(ctx, TranscriptKey(tenant, id))
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("storage: read transcript %s/%s: %w", tenant, id, err)
	}
	refs, err := listChunks(ctx, s, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("storage: read transcript %s/%s: %w", tenant, id, err)
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("storage: read transcript %s/%s: %w", tenant, id, ErrNotFound)
	}
	var buf bytes.Buffer
	if err := writeLines(ctx, s, refs, &buf); err != nil {
		return nil, fmt.Errorf("storage: read transcript %s/%s: %w", tenant, id, err)
	}
	return buf.Bytes(), nil
}

// ReassembleIfAssembled assembles a query's transcript again if one exists,
// so late chunks (an older attempt's, flushed by a worker that restarted
// after a crash) join it. With no transcript it does nothing: the attempt
// that ends the query assembles it.
func ReassembleIfAssembled(ctx context.Context, s Store, tenant, id string) error {
	if _, err := s.Get(ctx, TranscriptKey(tenant, id)); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	return AssembleTranscript(ctx, s, tenant, id)
}
