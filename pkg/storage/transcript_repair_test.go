package storage_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// TestMergeTranscript: the transcript is the stream's lines, joined with
// lines only a chunk holds (a journal's spill of lines that never reached
// the stream); for a seq held by both, the higher attempt wins, the stream
// on a tie.
func TestMergeTranscript(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	stream := []storage.StreamLine{
		{Seq: 4, Attempt: 2, Data: []byte("d")},
		{Seq: 1, Attempt: 1, Data: []byte("a")},
		{Seq: 3, Attempt: 2, Data: []byte("c")},
		{Seq: 2, Attempt: 1, Data: []byte("b")},
	}
	require.Equal(t, "a\nb\nc\nd\n", string(storage.StreamTranscript(append([]storage.StreamLine(nil), stream...))))

	got, keys, err := storage.MergeTranscript(ctx, s, "t", "q", stream)
	require.NoError(t, err)
	require.Empty(t, keys)
	require.Equal(t, "a\nb\nc\nd\n", string(got))

	// Attempt 1 spilled seqs 2-3 (3 is a line the stream never took, and
	// attempt 2 reused its seq); attempt 2 spilled 5, which never reached
	// the stream either.
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 2, 1), []byte("B\nzombie\n")))
	require.NoError(t, s.Put(ctx, storage.ChunkKey("t", "q", 5, 2), []byte("e\n")))
	got, keys, err = storage.MergeTranscript(ctx, s, "t", "q", stream)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.Equal(t, "a\nb\nc\nd\ne\n", string(got), "stream wins a tie, the higher attempt wins a seq, chunk-only lines join")
}

// TestFSPutBatch: every object of a batch is stored, in new and existing
// directories, replacing old values, with no temporary file left.
func TestFSPutBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, s.Put(ctx, "a/old", []byte("old")))
	objs := []storage.Object{
		{Key: "a/old", Value: []byte("new")},
		{Key: "a/b/c", Value: []byte("c")},
		{Key: "d/e", Value: nil},
	}
	require.NoError(t, storage.PutBatch(ctx, s, objs))
	for _, o := range objs {
		got, err := s.Get(ctx, o.Key)
		require.NoError(t, err)
		require.Equal(t, string(o.Value), string(got))
	}
	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{"a/b/c", "a/old", "d/e"}, keys, "no temporary file is left")
	require.ErrorIs(t, storage.PutBatch(ctx, s, []storage.Object{{Key: "../x", Value: nil}}), storage.ErrInvalidKey)
}
