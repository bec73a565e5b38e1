package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// agentPIDs finds the processes that talk to this test's fake API: their
// environment names its (per-test) URL, so no other test's process matches.
func agentPIDs(t *testing.T, fake *anthropicfake.Server) []int {
	t.Helper()
	want := []byte("ANTHROPIC_BASE_URL=" + fake.URL + "\x00")
	dirs, err := filepath.Glob("/proc/[0-9]*")
	require.NoError(t, err)
	var pids []int
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestClaudeSessionResumesAfterAgentKilled: the real CLI is SIGKILLed in
// the middle of a turn (held at the API). The worker restores the last
// checkpoint, resumes the session in a new CLI process and runs the turn's
// input again: the API then sees the whole history with that input once,
// and the session goes on to one succeeded status.
func TestClaudeSessionResumesAfterAgentKilled(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	slowStarted := make(chan struct{}, 4)
	var slowSeen atomic.Int32
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "slow" {
			if slowSeen.Add(1) == 1 {
				slowStarted <- struct{}{}
				return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("thinking"), anthropicfake.Text("never")}, Hold: hold}
			}
		}
		return text("answer to " + r.LastUserText())
	})
	b.worker(t, 1)
	f := b.f
	sw := watchStatus(t, f, "default", "ck-1")
	submitSession(t, f, "default", "ck-1", "remember 42", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)

	sendCtl(t, f, "default", "ck-1", input("slow"))
	select {
	case <-slowStarted:
	case <-time.After(wait):
		t.Fatal("the slow turn never reached the API")
	}
	pids := agentPIDs(t, b.fake)
	require.NotEmpty(t, pids, "the CLI's process")
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	resumed := sw.waitFor("running after the kill", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateRunning && ev.Error != nil
	})
	require.Contains(t, resumed.Error.Message, "killed")
	sw.state(protocol.StateIdle, 3)
	sendCtl(t, f, "default", "ck-1", protocol.CtlOp{Op: protocol.OpEnd})

	r := f.Follow("default", "ck-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	res := results(r)
	require.Len(t, res, 3)
	require.Equal(t, "process_exit", res[1]["x_fleet"].(map[string]any)["reason"])
	require.Equal(t, "answer to slow", res[2]["result"])
	conv := b.fake.Conversation()
	last := conv[len(conv)-1]
	require.Equal(t, []string{"remember 42", "slow"}, last.UserTexts(), "the killed turn's input once, after the history")
	require.Equal(t, []string{"answer to remember 42"}, last.AssistantTexts())
	sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, 1, terminalCount(sw.all()))
}
