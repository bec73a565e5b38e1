package workspace_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// TestLocalContained runs the workspace suite with git in contained Local
// sandboxes (docs/contained.md): the remotes (file:// repositories of the test,
// invisible inside) are fetched from and pushed to by the worker's side
// against the checkout's directory, every other git command runs inside
// as the agent's uid, and the checkout stays the agent's.
func TestLocalContained(t *testing.T) {
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	root := t.TempDir()
	workspacetest.Exercise(t, func(t *testing.T) sandbox.Provider {
		l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root, Isolation: sandbox.IsolationContained})
		require.NoError(t, err)
		return l
	}, workspacetest.Features{Dir: func(id string) string { return filepath.Join(root, id) }})
}
