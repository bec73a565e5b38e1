package workspace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Git on the worker's side refuses a checkout whose .git or object store
// an agent replaced with a symlink (it would read the worker's files).
func TestHostGitRefusesSymlinkedGitDir(t *testing.T) {
	w := &Workspaces{}
	elsewhere := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(elsewhere, "objects"), 0o700))

	dir := t.TempDir()
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(dir, ".git")))
	_, err := w.hostGit(t.Context(), dir, gitCall{step: "push", args: []string{"status"}, network: true})
	require.ErrorContains(t, err, "the checkout's .git is not a directory")

	dir = t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, ".git"), 0o700))
	require.NoError(t, os.Symlink(filepath.Join(elsewhere, "objects"), filepath.Join(dir, ".git", "objects")))
	_, err = w.hostGit(t.Context(), dir, gitCall{step: "push", args: []string{"status"}, network: true})
	require.ErrorContains(t, err, "the checkout's .git/objects is not a directory")
}
