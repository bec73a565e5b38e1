package storage_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

func newFS(t *testing.T) *storage.FS {
	t.Helper()
	s, err := storage.NewFS(filepath.Join(t.TempDir(), "data"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestFSExercise(t *testing.T) {
	t.Parallel()
	storagetest.Exercise(t, func(t *testing.T) storage.Store { return newFS(t) }, storagetest.Features{})
}

func TestFSStoresKeysAsFilesUnderRoot(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	require.NoError(t, s.Put(t.Context(), "queries/t/q1/transcript.ndjson", []byte("line\n")))
	b, err := os.ReadFile(filepath.Join(s.Root(), "queries", "t", "q1", "transcript.ndjson"))
	require.NoError(t, err)
	require.Equal(t, "line\n", string(b))
}

func TestFSLeavesNoTempFiles(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	ctx := t.Context()
	require.NoError(t, s.Put(ctx, "a/k", []byte("v")))
	require.NoError(t, s.Create(ctx, "a/c", []byte("v")))
	require.ErrorIs(t, s.Create(ctx, "a/c", []byte("w")), storage.ErrExists)
	require.NoError(t, s.PutStream(ctx, "a/s", strings.NewReader("v")))
	entries, err := os.ReadDir(filepath.Join(s.Root(), "a"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"c", "k", "s"}, names)
}

func TestFSListIgnoresForeignFiles(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	ctx := t.Context()
	require.NoError(t, s.Put(ctx, "a/k", []byte("v")))
	// A temporary file left by a crash and a file with a non-key name.
	require.NoError(t, os.WriteFile(filepath.Join(s.Root(), "a", "~tmp-123"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(s.Root(), "a", "has space"), []byte("x"), 0o600))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(s.Root(), "a", "link")))
	keys, err := s.List(ctx, "")
	require.NoError(t, err)
	require.Equal(t, []string{"a/k"}, keys)
}

func TestFSKeyAndDirectoryConflict(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	ctx := t.Context()
	require.NoError(t, s.Put(ctx, "a/b/c", []byte("v")))
	require.ErrorIs(t, s.Put(ctx, "a/b", []byte("v")), storage.ErrInvalidKey)
	require.ErrorIs(t, s.Create(ctx, "a/b", []byte("v")), storage.ErrInvalidKey)
	require.NoError(t, s.Delete(ctx, "a/b"), "a directory is not a key; deleting it is a no-op")
	requireGet(t, s, "a/b/c", "v")

	require.NoError(t, s.Put(ctx, "x/y", []byte("v")))
	require.ErrorIs(t, s.Put(ctx, "x/y/z", []byte("v")), storage.ErrInvalidKey)

	// Once a/b/c is deleted, its empty directory does not block a/b.
	require.NoError(t, s.Delete(ctx, "a/b/c"))
	require.NoError(t, s.Put(ctx, "a/b", []byte("now a file")))
	requireGet(t, s, "a/b", "now a file")
}

// PutBatch makes a key's directory only when staging finds it missing:
// new nested directories, existing ones, and a file in the way (an error
// wrapping ErrInvalidKey, with nothing of the batch left behind).
func TestFSPutBatchDirectories(t *testing.T) {
	t.Parallel()
	s := newFS(t)
	ctx := t.Context()
	require.NoError(t, s.Put(ctx, "status/t/old.json", []byte("old")))
	require.NoError(t, s.PutBatch(ctx, []storage.Object{
		{Key: "status/t/old.json", Value: []byte("new")},
		{Key: "queries/t/q1/transcript.ndjson", Value: []byte("line\n")},
		{Key: "queries/t/q1/lines/1.json", Value: []byte("{}")},
		{Key: "status/t/q1.json", Value: []byte("s")},
	}))
	requireGet(t, s, "status/t/old.json", "new")
	requireGet(t, s, "queries/t/q1/transcript.ndjson", "line\n")
	requireGet(t, s, "queries/t/q1/lines/1.json", "{}")
	requireGet(t, s, "status/t/q1.json", "s")

	err := s.PutBatch(ctx, []storage.Object{
		{Key: "status/t/q2.json", Value: []byte("s")},
		{Key: "status/t/old.json/x", Value: []byte("v")},
	})
	require.ErrorIs(t, err, storage.ErrInvalidKey)
	requireGet(t, s, "status/t/old.json", "new")
	_, err = s.Get(ctx, "status/t/q2.json")
	require.ErrorIs(t, err, storage.ErrNotFound, "a failed batch renames nothing")
	require.NoError(t, filepath.WalkDir(s.Root(), func(p string, d os.DirEntry, err error) error {
		require.NoError(t, err)
		require.False(t, strings.HasPrefix(d.Name(), "~tmp-"), "temporary file left: %s", p)
		return nil
	}))
}

func TestNewFSRejectsAFile(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err := storage.NewFS(f)
	require.Error(t, err)
	_, err = storage.NewFS("")
	require.Error(t, err)
}

func requireGet(t *testing.T, s storage.Store, key, want string) {
	t.Helper()
	got, err := s.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, want, string(got))
}
