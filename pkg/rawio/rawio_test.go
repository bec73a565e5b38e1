//go:build unix

package rawio

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// WriteAll and ReadFile round-trip contents shorter and longer than
// ReadFile's first buffer; a missing file is fs.ErrNotExist in a
// *fs.PathError naming it, as with package os.
func TestWriteAllReadFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, 255, 256, 257, 100_000} {
		want := bytes.Repeat([]byte{'x'}, n)
		p := filepath.Join(dir, "f")
		fd, err := Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
		require.NoError(t, err)
		require.NoError(t, WriteAll(fd, want))
		require.NoError(t, unix.Close(fd))
		got, err := ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, want, got, "%d bytes", n)
		onDisk, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, want, onDisk)
	}
	missing := filepath.Join(dir, "missing")
	_, err := ReadFile(missing)
	require.ErrorIs(t, err, fs.ErrNotExist)
	var pe *fs.PathError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, missing, pe.Path)
}
