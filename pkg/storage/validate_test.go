package storage_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

func TestValidateKeyAcceptsLayoutKeys(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		storage.TranscriptKey("default", "q1"),
		storage.ChunkKey("t-1", "Q_2", 1, 1),
		storage.LineKey("t", "id", 99),
		storage.StatusKey("t", "id"),
		"a", "a=b/c.d_e-f", ".x/y.", "...",
		strings.Repeat("s", storage.MaxSegmentBytes),
	} {
		require.NoError(t, storage.ValidateKey(key), key)
	}
}

func TestValidateKeyRejects(t *testing.T) {
	t.Parallel()
	for _, key := range append(storagetest.InvalidKeys(), strings.Repeat("s", storage.MaxSegmentBytes+1)) {
		require.ErrorIs(t, storage.ValidateKey(key), storage.ErrInvalidKey, "%q", key)
	}
}

// FuzzValidateKey checks that every key ValidateKey accepts is safe to use
// as a relative path and matches the documented grammar.
func FuzzValidateKey(f *testing.F) {
	for _, k := range append(storagetest.InvalidKeys(), "a/b", "a=b/c.d_e-f", ".../x", "a/./b") {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if storage.ValidateKey(key) != nil {
			return
		}
		require.LessOrEqual(t, len(key), storage.MaxKeyBytes)
		require.False(t, strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/"))
		for _, seg := range strings.Split(key, "/") {
			require.NotContains(t, []string{"", ".", ".."}, seg)
			require.LessOrEqual(t, len(seg), storage.MaxSegmentBytes)
			for _, c := range []byte(seg) {
				require.True(t, c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._=-", c) >= 0, "byte %q", c)
			}
		}
	})
}
