package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// TestWorkspaceRealClaudeCodeWriteComesBack: the real Claude Code CLI
// (pinned, against the fake Anthropic API) writes a file with its Write
// tool under acceptEdits, and the file comes back in the artifact and the
// stored diff after its sandbox is gone.
func TestWorkspaceRealClaudeCodeWriteComesBack(t *testing.T) {
	t.Parallel()
	claude := claudetest.Path(t)
	root := t.TempDir()
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if len(r.ToolResults()) == 0 {
			// Local sandboxes live at <root>/<tenant>-<id>-<seq>-<attempt>/work;
			// the run's is the one there while it asks.
			dirs, _ := filepath.Glob(filepath.Join(root, "default-ws-claude-*", "work"))
			if len(dirs) != 1 {
				return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text(fmt.Sprintf("no single sandbox: %v", dirs))}}
			}
			notes := filepath.Join(dirs[0], "NOTES.md")
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{
				anthropicfake.ToolUse("Write", map[string]any{"file_path": notes, "content": "written by claude\n"}),
			}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("wrote NOTES.md")}}
	})
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: root, Env: fake.Env()})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1,
		AgentMod: func(c *agent.Config) { c.Command = []string{claude} },
		Mod:      func(c *worker.Config) { c.Providers[protocol.SandboxLocal] = local },
	})
	fleettest.WaitReady(t, w.W)
	repo := workspacetest.NewRepo(t, t.TempDir())
	b, err := json.Marshal(protocol.Job{ID: "ws-claude", Prompt: "Write NOTES.md saying who wrote it.",
		Options: protocol.Options{PermissionMode: "acceptEdits"}, Workspace: &protocol.Workspace{Repo: repo.URL}})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "ws-claude", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)

	art := artifactOf(t, f, "ws-claude")
	require.Equal(t, []protocol.ArtifactFile{{Path: "NOTES.md", Status: protocol.FileAdded, Additions: 1}}, art.Files)
	diff, err := f.Objects.Get(context.Background(), storage.DiffKey("default", "ws-claude"))
	require.NoError(t, err)
	require.Contains(t, string(diff), "+written by claude")
	conv := fake.Conversation()
	require.GreaterOrEqual(t, len(conv), 2)
	require.NotContains(t, conv[len(conv)-1].ToolResults()[0], "rror", "the Write tool ran: %s", conv[len(conv)-1].ToolResults())
}
