package storage_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// TestRepairTranscript: lines only the stream holds (a lost worker's tail,
// or lines held only by a lower, superseded attempt's chunk) are added;
// what the chunks hold is left as it is; a second repair adds nothing.
func TestRepairTranscript(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	// Attempt 1 flushed seqs 1-2; seq 3 of attempt 1 is a zombie's line the
	// stream never took; attempt 2 wrote 3-4 to the stream only.
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 1, 1), []byte("a\nb\nzombie\n")))
	stream := []storage.StreamLine{
		{Seq: 4, Attempt: 2, Data: []byte("d")},
		{Seq: 1, Attempt: 1, Data: []byte("a")},
		{Seq: 3, Attempt: 2, Data: []byte("c")},
		{Seq: 2, Attempt: 1, Data: []byte("b")},
	}
	added, err := storage.RepairTranscript(ctx, s, "t", "q", stream)
	require.NoError(t, err)
	require.Equal(t, 2, added)
	got, err := s.Get(ctx, storage.TranscriptKey("t", "q"))
	require.NoError(t, err)
	require.Equal(t, "a\nb\nc\nd\n", string(got))

	added, err = storage.RepairTranscript(ctx, s, "t", "q", stream)
	require.NoError(t, err)
	require.Zero(t, added)
}
