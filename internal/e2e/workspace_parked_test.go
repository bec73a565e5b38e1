package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// TestCLIParkedWorkspaceSessionShowsItsWork: while a workspace
// session (real Claude Code against the fake API) is parked, `status` and
// `diff` show its work as of its last checkpoint and say so; once it ends,
// they show the final work without the mark. Before, a parked session's
// work was invisible until it ended ("no workspace artifact").
func TestCLIParkedWorkspaceSessionShowsItsWork(t *testing.T) {
	t.Parallel()
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		last := r.Messages[len(r.Messages)-1]
		if strings.Contains(string(last.Content), "tool_result") {
			return text("done")
		}
		name := strings.TrimPrefix(r.LastUserText(), "write ")
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash",
			map[string]any{"command": "echo " + name + " > " + name + ".txt"})}}
	})
	b.worker(t, 1)
	f := b.f
	url := f.Srv.ClientURL()
	storage := "file://" + filepath.Join(f.Dir, "data")
	repo := workspacetest.NewRepo(t, t.TempDir())
	sw := watchStatus(t, f, "default", "ws-park")
	one := 1
	body := mustJSON(t, protocol.Job{ID: "ws-park", Prompt: "write first", Session: &protocol.Session{IdleTimeoutS: &one},
		Options: protocol.Options{AllowedTools: []string{"Bash"}}, Workspace: &protocol.Workspace{Repo: repo.URL}})
	f.PublishJob("default", body, nil)
	sw.state(protocol.StateParked, 1)

	// status (JSON): the parked status carries the work, marked.
	code, out, errOut := runCLI(t, url, "", "status", "ws-park")
	require.Equal(t, fleetcli.ExitRunning, code, errOut)
	var st protocol.StatusEvent
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Equal(t, protocol.StateParked, st.State)
	require.NotNil(t, st.Workspace, "the parked status carries the work: %s", out)
	require.Equal(t, repo.Main, st.Workspace.StartSHA)
	require.NotEmpty(t, st.Workspace.EndSHA)
	require.Equal(t, 1, st.Workspace.FilesChanged)
	require.True(t, st.Workspace.Checkpoint, out)
	// status for people says so.
	_, out, _ = runCLI(t, url, "", "status", "ws-park", "--json=false")
	require.Contains(t, out, "workspace (as of the last checkpoint): fleet/default/ws-park · 1 files · +1 −0")
	// diff --stat and diff: the work so far, marked.
	code, out, errOut = runCLI(t, url, "", "diff", "ws-park", "--stat")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "· as of the last checkpoint")
	require.Contains(t, out, "A first.txt +1 −0")
	code, out, errOut = runCLI(t, url, "", "diff", "ws-park", "--storage", storage)
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "+first")
	require.Contains(t, errOut, "as of the last checkpoint")

	// Resumed and ended: the final work, without the mark.
	sendCtl(t, f, "default", "ws-park", input("write second"))
	sw.waitFor("idle turn 2 after the resume", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateIdle && ev.Turn == 2
	})
	sendCtl(t, f, "default", "ws-park", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "ws-park", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.NotNil(t, r.Final.Workspace)
	require.False(t, r.Final.Workspace.Checkpoint)
	require.Equal(t, 2, r.Final.Workspace.FilesChanged)
	code, out, errOut = runCLI(t, url, "", "diff", "ws-park", "--storage", storage)
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "+second")
	require.NotContains(t, errOut, "checkpoint")
	_, out, _ = runCLI(t, url, "", "diff", "ws-park", "--stat")
	require.NotContains(t, out, "checkpoint")
}
