package storage

import (
	"bytes"
	"cmp"
	"context"
	"errors"
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

// RepairTranscript makes the query's stored transcript hold every line of
// lines (the query's lines as the stream holds them, in any order): lines
// no chunk holds, or that only a lower attempt's chunk holds, are written
// as chunks of their own (one line each, under ChunkKey, created only where
// no object is yet), then the transcript is assembled.
// It reports how many lines it added; with none missing it writes nothing,
// and a transcript that already equals the lines is left alone.
//
// Chunks written here follow the journal's rules (keys sort by first seq,
// the higher attempt wins a seq), so a later AssembleTranscript, e.g. by a
// worker that comes back and flushes its journal, keeps them.
func RepairTranscript(ctx context.Context, s Store, tenant, id string, lines []StreamLine) (int, error) {
	if !protocol.ValidTenant(tenant) || !protocol.ValidID(id) {
		return 0, fmt.Errorf("storage: repair transcript %q/%q: %w", tenant, id, ErrInvalidKey)
	}
	if len(lines) == 0 {
		return 0, nil
	}
	// The stream's view: one line per seq, the highest attempt's.
	slices.SortStableFunc(lines, func(a, b StreamLine) int {
		if a.Seq != b.Seq {
			return cmp.Compare(a.Seq, b.Seq)
		}
		return a.Attempt - b.Attempt
	})
	want := lines[:0:0]
	for _, l := range lines {
		if n := len(want); n > 0 && want[n-1].Seq == l.Seq {
			want[n-1] = l
			continue
		}
		want = append(want, l)
	}
	var full bytes.Buffer
	for _, l := range want {
		full.Write(l.Data)
		full.WriteByte('\n')
	}
	if cur, err := s.Get(ctx, TranscriptKey(tenant, id)); err == nil && bytes.Equal(cur, full.Bytes()) {
		return 0, nil
	}
	held, err := storedSeqs(ctx, s, tenant, id)
	if err != nil {
		return 0, fmt.Errorf("storage: repair transcript %s/%s: %w", tenant, id, err)
	}
	// One chunk per missing line, written only if its key is free: a
	// worker's journal may put a chunk that starts at the same seq with the
	// same attempt later (it then holds the same line and more), and a
	// longer chunk must never be replaced by a shorter one.
	added := 0
	for _, l := range want {
		if a, ok := held[l.Seq]; ok && a >= l.Attempt {
			continue
		}
		key := ChunkKey(tenant, id, l.Seq, l.Attempt)
		value := append(append([]byte(nil), l.Data...), '\n')
		var err error
		if c, ok := s.(Creator); ok {
			if err = c.Create(ctx, key, value); errors.Is(err, ErrExists) {
				continue
			}
		} else {
			err = s.Put(ctx, key, value)
		}
		if err != nil {
			return added, fmt.Errorf("storage: repair transcript %s/%s: %w", tenant, id, err)
		}
		added++
	}
	if err := AssembleTranscript(ctx, s, tenant, id); err != nil {
		return added, err
	}
	return added, nil
}

// storedSeqs maps every seq the query's chunks hold to the highest attempt
// holding it.
func storedSeqs(ctx context.Context, s Store, tenant, id string) (map[uint64]int, error) {
	refs, err := listChunks(ctx, s, tenant, id)
	if err != nil {
		return nil, err
	}
	held := map[uint64]int{}
	for _, ref := range refs {
		data, err := s.Get(ctx, ref.key)
		if err != nil {
			return nil, fmt.Errorf("read chunk %s: %w", ref.key, err)
		}
		c, err := splitChunk(ref, data)
		if err != nil {
			return nil, err
		}
		for i := range c.lines() {
			seq := c.first + uint64(i)
			if a, ok := held[seq]; !ok || ref.attempt > a {
				held[seq] = ref.attempt
			}
		}
	}
	return held, nil
}
