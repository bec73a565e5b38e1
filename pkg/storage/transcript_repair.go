package storage

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// StreamLine is one line of a query as its stream holds it.
type StreamLine struct {
	Seq     uint64
	Attempt int
	Data    []byte // without its newline
}

// StreamTranscript is the transcript of lines (a query's lines as its
// stream holds them, in any order): for every seq the highest attempt's
// line, in seq order, each followed by "\n". It sorts lines in place.
func StreamTranscript(lines []StreamLine) []byte {
	want := dedupe(lines)
	n := 0
	for _, l := range want {
		n += len(l.Data) + 1
	}
	out := make([]byte, 0, n)
	for _, l := range want {
		out = append(out, l.Data...)
		out = append(out, '\n')
	}
	return out
}

// dedupe sorts lines by seq and keeps, for each seq, the highest attempt's.
func dedupe(lines []StreamLine) []StreamLine {
	slices.SortStableFunc(lines, func(a, b StreamLine) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Attempt, b.Attempt))
	})
	want := lines[:0:0]
	for _, l := range lines {
		if n := len(want); n > 0 && want[n-1].Seq == l.Seq {
			want[n-1] = l
			continue
		}
		want = append(want, l)
	}
	return want
}

// MergeTranscript is the transcript of a query from both of its sources:
// lines (as the stream holds them) and the query's chunk objects (lines a
// worker's journal stored because they never reached the stream: an
// attempt that lost NATS and then its host, or was handed back). For every
// seq the highest attempt's line wins, the stream's on a tie. It also
// returns the chunk keys it read, so a caller can tell whether chunks came
// in while it wrote. Nothing is written.
func MergeTranscript(ctx context.Context, s Store, tenant, id string, lines []StreamLine) ([]byte, []string, error) {
	if !protocol.ValidTenant(tenant) || !protocol.ValidID(id) {
		return nil, nil, fmt.Errorf("storage: merge transcript %q/%q: %w", tenant, id, ErrInvalidKey)
	}
	refs, err := listChunks(ctx, s, tenant, id)
	if err != nil {
		return nil, nil, fmt.Errorf("storage: merge transcript %s/%s: %w", tenant, id, err)
	}
	keys := make([]string, 0, len(refs))
	all := slices.Clone(lines)
	for _, ref := range refs {
		keys = append(keys, ref.key)
		data, err := s.Get(ctx, ref.key)
		if err != nil {
			return nil, nil, fmt.Errorf("storage: merge transcript %s/%s: read chunk %s: %w", tenant, id, ref.key, err)
		}
		c, err := splitChunk(ref, data)
		if err != nil {
			return nil, nil, err
		}
		for i := range c.lines() {
			line := bytes.TrimSuffix(c.data[c.offs[i]:c.offs[i+1]], []byte("\n"))
			// Chunk lines sort before stream lines of the same seq and
			// attempt (stable sort, chunks first), so the stream wins a tie.
			all = append(all, StreamLine{Seq: c.first + uint64(i), Attempt: ref.attempt, Data: line})
		}
	}
	if len(refs) > 0 {
		// Chunks first, then the stream, so that dedupe's stable sort lets
		// the stream's line win a tie of seq and attempt.
		all = append(all[len(lines):], all[:len(lines)]...)
	}
	return StreamTranscript(all), keys, nil
}

// ChunkKeys returns the keys of a query's chunk objects, in key order.
func ChunkKeys(ctx context.Context, s Store, tenant, id string) ([]string, error) {
	refs, err := listChunks(ctx, s, tenant, id)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(refs))
	for _, r := range refs {
		keys = append(keys, r.key)
	}
	return keys, nil
}
