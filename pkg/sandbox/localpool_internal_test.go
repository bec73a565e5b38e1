package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// touchedSince says "touched" only from an mtime at or after the time the
// tree was handed out; anything else is left to pristine.
func TestTouchedSinceReadsOnlyTheMtime(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, localClaudeDir), 0o700))
	require.False(t, touchedSince(dir, time.Time{}), "no hand-out time: unknown, not touched")
	require.False(t, touchedSince(dir, time.Now().Add(time.Hour)), "made before the hand-out")
	require.True(t, touchedSince(dir, time.Now().Add(-time.Hour)), "changed after the hand-out")
	require.False(t, touchedSince(filepath.Join(dir, "missing"), time.Now().Add(-time.Hour)), "no config dir: left to pristine")
}
