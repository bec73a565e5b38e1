package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// TestWorkspaceSessionParkResumeKeepsTheWork: a session (real Claude Code
// against the fake API) on a workspace writes a file, parks on its idle
// timeout, and resumes with a second input on a fresh sandbox: the first
// turn's file is there, and the final artifact holds both turns' work
// against the first start_sha.
func TestWorkspaceSessionParkResumeKeepsTheWork(t *testing.T) {
	t.Parallel()
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		last := r.Messages[len(r.Messages)-1]
		if strings.Contains(string(last.Content), "tool_result") {
			return text("done")
		}
		name := strings.TrimPrefix(r.LastUserText(), "write ")
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash",
			map[string]any{"command": "cat first.txt 2>/dev/null; echo " + name + " > " + name + ".txt"})}}
	})
	b.worker(t, 1)
	f := b.f
	repo := workspacetest.NewRepo(t, t.TempDir())
	sw := watchStatus(t, f, "default", "ws-sess")
	one := 1
	body := mustJSON(t, protocol.Job{ID: "ws-sess", Prompt: "write first", Session: &protocol.Session{IdleTimeoutS: &one},
		Options: protocol.Options{AllowedTools: []string{"Bash"}}, Workspace: &protocol.Workspace{Repo: repo.URL}})
	f.PublishJob("default", body, nil)
	sw.state(protocol.StateParked, 1)

	sendCtl(t, f, "default", "ws-sess", input("write second"))
	sw.waitFor("idle turn 2 after the resume", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateIdle && ev.Turn == 2
	})
	sendCtl(t, f, "default", "ws-sess", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "ws-sess", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)

	art := artifactOf(t, f, "ws-sess")
	require.Equal(t, repo.Main, art.StartSHA)
	var paths []string
	for _, fl := range art.Files {
		paths = append(paths, fl.Path)
	}
	require.Equal(t, []string{"first.txt", "second.txt"}, paths, "both turns' work, across the park")
	diff, err := f.Objects.Get(context.Background(), storage.DiffKey("default", "ws-sess"))
	require.NoError(t, err)
	require.Contains(t, string(diff), "+first")
	require.Contains(t, string(diff), "+second")
	// The resumed turn's tool saw the first turn's file.
	conv := b.fake.Conversation()
	require.Contains(t, conv[len(conv)-1].ToolResults()[len(conv[len(conv)-1].ToolResults())-1], "first")
}
