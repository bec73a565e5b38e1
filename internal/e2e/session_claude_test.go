package e2e

// Sessions with the real Claude Code CLI (pinned, installed by .ci/run into
// .tools/claude) talking to the fake Anthropic API. Each CLI start costs a
// second or two, so the scenarios are few and each covers several points.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

type claudeBundle struct {
	f      *fleettest.Fleet
	fake   *anthropicfake.Server
	claude string
	env    map[string]string
}

func setupClaude(t *testing.T, reply anthropicfake.ReplyFunc) *claudeBundle {
	t.Helper()
	claude := claudetest.Path(t)
	b := &claudeBundle{claude: claude, fake: anthropicfake.New(t, reply)}
	b.env = b.fake.Env()
	b.env["IS_SANDBOX"] = "1"
	b.f = fleettest.New(t, fleettest.Opts{AckWait: 5 * time.Second})
	return b
}

func (b *claudeBundle) worker(t *testing.T, slots int) *fleettest.Worker {
	t.Helper()
	w := b.f.StartWorker(fleettest.WorkerOpts{Slots: slots, SandboxEnv: b.env,
		AgentMod: func(c *agent.Config) { c.Command = []string{b.claude} },
		Mod:      containedIfAsked(t, b.env)})
	fleettest.WaitReady(t, w.W)
	return w
}

func text(s string) anthropicfake.Reply {
	return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text(s)}}
}

// userTurns are the fake's conversation requests whose last message is the
// user's text (not a tool result): one per turn.
func userTurns(fake *anthropicfake.Server) []string {
	var out []string
	for _, r := range fake.Conversation() {
		if r.LastUserText() != "" && !strings.Contains(string(r.Messages[len(r.Messages)-1].Content), "tool_result") {
			out = append(out, r.LastUserText())
		}
	}
	return out
}

func terminalCount(evs []protocol.StatusEvent) int {
	n := 0
	for _, ev := range evs {
		if ev.State.Terminal() {
			n++
		}
	}
	return n
}

// TestClaudeSessionTurnsQueueInterruptEnd: the prompt's turn, then a turn
// held at the API while two inputs are published (they queue in the
// worker), an interrupt ends the held turn, the two inputs run as two turns
// in order, each request carrying the history; end gives one succeeded
// status; Fleet-Seq is contiguous.
func TestClaudeSessionTurnsQueueInterruptEnd(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	slowStarted := make(chan struct{}, 1)
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "slow" {
			slowStarted <- struct{}{}
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("thinking"), anthropicfake.Text("never")}, Hold: hold}
		}
		return text("answer to " + r.LastUserText())
	})
	b.worker(t, 1)
	f := b.f
	sw := watchStatus(t, f, "default", "cs-1")
	submitSession(t, f, "default", "cs-1", "first", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)

	sendCtl(t, f, "default", "cs-1", input("slow"))
	select {
	case <-slowStarted:
	case <-time.After(wait):
		t.Fatal("the slow turn never reached the API")
	}
	sendCtl(t, f, "default", "cs-1", input("queued one"))
	sendCtl(t, f, "default", "cs-1", input("queued two"))
	sendCtl(t, f, "default", "cs-1", protocol.CtlOp{Op: protocol.OpInterrupt})
	sw.state(protocol.StateIdle, 4)
	sendCtl(t, f, "default", "cs-1", protocol.CtlOp{Op: protocol.OpEnd})

	r := f.Follow("default", "cs-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "end succeeds whatever the last turn said")
	require.Equal(t, 4, r.Final.Turn)
	res := results(r)
	require.Len(t, res, 4, "every turn has its result line")
	require.Equal(t, false, res[0]["is_error"])
	require.Equal(t, true, res[1]["is_error"], "the interrupted turn ends with an error result")
	require.Equal(t, "answer to queued one", res[2]["result"])
	require.Equal(t, "answer to queued two", res[3]["result"])

	// Two queued inputs became two turns, in order, each with the history.
	require.Equal(t, []string{"first", "slow", "queued one", "queued two"}, userTurns(b.fake))
	conv := b.fake.Conversation()
	last := conv[len(conv)-1]
	var history []string
	for _, s := range last.UserTexts() {
		if !strings.HasPrefix(s, "[Request interrupted") { // the CLI's own marker
			history = append(history, strings.TrimSpace(s))
		}
	}
	require.Equal(t, []string{"first", "slow", "queued one", "queued two"}, history)
	require.Contains(t, last.AssistantTexts(), "answer to first")
	require.Contains(t, last.AssistantTexts(), "answer to queued one")

	sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, 1, terminalCount(sw.all()))
}

// TestClaudeSessionApprovalsRelayed: with approvals remote, the agent's
// permission request is relayed on .msg, the status is awaiting_approval
// with its request_id and tool_name; allow (through the dispatcher API)
// runs the tool, deny (on .ctl) does not.
func TestClaudeSessionApprovalsRelayed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if strings.Contains(string(r.Messages[len(r.Messages)-1].Content), "tool_result") {
			res := r.ToolResults()
			return text("tool said: " + res[len(res)-1])
		}
		name := r.LastUserText()
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{
			"command": "touch " + filepath.Join(dir, name) + " && echo made-" + name, "description": "make a file"})}}
	})
	b.worker(t, 1)
	f := b.f
	sw := watchStatus(t, f, "default", "cs-2")
	submitSession(t, f, "default", "cs-2", "allowed", &protocol.Session{Approvals: protocol.ApprovalsRemote}, protocol.Options{})

	ev := sw.waitFor("awaiting_approval 1", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateAwaitingApproval && ev.Turn == 0
	})
	require.Equal(t, "Bash", ev.ToolName)
	require.NotEmpty(t, ev.RequestID)
	_, err := os.Stat(filepath.Join(dir, "allowed"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing runs before the answer")
	allow := true
	rep := apiOp(t, f, protocol.OpApprove, protocol.SessionOpRequest{ID: "cs-2", SessionOp: protocol.SessionOp{RequestID: ev.RequestID, Allow: &allow}})
	require.Nil(t, rep.Error)
	sw.state(protocol.StateIdle, 1)
	_, err = os.Stat(filepath.Join(dir, "allowed"))
	require.NoError(t, err, "the allowed tool ran")

	sendCtl(t, f, "default", "cs-2", input("denied"))
	ev = sw.waitFor("awaiting_approval 2", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateAwaitingApproval && ev.Turn == 1
	})
	deny := false
	sendCtl(t, f, "default", "cs-2", protocol.CtlOp{Op: protocol.OpApprove, SessionOp: protocol.SessionOp{RequestID: ev.RequestID, Allow: &deny, Message: "no files today"}})
	sw.state(protocol.StateIdle, 2)
	_, err = os.Stat(filepath.Join(dir, "denied"))
	require.ErrorIs(t, err, os.ErrNotExist, "the denied tool did not run")

	rep = apiOp(t, f, protocol.OpEnd, protocol.SessionOpRequest{ID: "cs-2"})
	require.Nil(t, rep.Error)
	r := f.Follow("default", "cs-2", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	var requests int
	for _, l := range r.Lines {
		if strings.Contains(string(l.Data), `"can_use_tool"`) && strings.Contains(string(l.Data), `"control_request"`) {
			requests++
		}
	}
	require.Equal(t, 2, requests, "both permission requests are relayed on .msg")
	res := results(r)
	require.Contains(t, res[0]["result"], "made-allowed")
	require.NotContains(t, res[1]["result"], "made-denied")
}

// apiOp sends a dispatcher session-op request.
func apiOp(t *testing.T, f *fleettest.Fleet, op string, req protocol.SessionOpRequest) protocol.APIReply {
	t.Helper()
	bb, err := json.Marshal(req)
	require.NoError(t, err)
	m, err := f.NC.Request(f.Names.APISessionOp(op), bb, 30*time.Second)
	require.NoError(t, err)
	var rep protocol.APIReply
	require.NoError(t, json.Unmarshal(m.Data, &rep))
	return rep
}

// TestClaudeSessionParkResumeAnywhere: a session parks after its idle
// timeout (status parked, the job acked, the slot free: a one-shot job runs
// on the same one-slot worker); its worker is then SIGKILLed; the next input
// resumes the session on another worker from the checkpoint, and the fake
// API sees the whole history with no input applied twice; Fleet-Seq is
// contiguous across both jobs. Then options.resume of that query works for
// a one-shot job of the same tenant, and is refused for another tenant.
func TestClaudeSessionParkResumeAnywhere(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	b := setupClaude(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		mu.Lock()
		defer mu.Unlock()
		return text("answer to " + r.LastUserText())
	})
	f := b.f
	sdir := filepath.Join(f.Dir, "data")
	a := fleettest.StartWorkerProcessWith(t, f.Srv.ClientURL(), t.TempDir(), sdir, []string{b.claude}, b.env)
	sw := watchStatus(t, f, "default", "cs-3")
	one := 1
	submitSession(t, f, "default", "cs-3", "remember the number 42", &protocol.Session{IdleTimeoutS: &one}, protocol.Options{})
	a.Expect(t, "started cs-3 1")
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "cs-3", input("and remember 7"))
	sw.state(protocol.StateIdle, 2)
	parked := sw.state(protocol.StateParked, 2)
	require.NotEmpty(t, parked.ClaudeSessionID)

	// The slot is free: a one-shot job runs on the same one-slot worker.
	f.SubmitJSON("default", "after-park", "one-shot while parked")
	a.Expect(t, "started after-park 1")
	r := f.Follow("default", "after-park", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)

	a.Kill(t)
	b.worker(t, 1)
	sendCtl(t, f, "default", "cs-3", input("what was the number?"))
	sw.waitFor("idle turn 3 after the resume", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateIdle && ev.Turn == 3
	})
	sendCtl(t, f, "default", "cs-3", protocol.CtlOp{Op: protocol.OpEnd})
	r = f.Follow("default", "cs-3", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 3, r.Final.Turn)
	res := results(r)
	require.Len(t, res, 3)
	require.Equal(t, parked.ClaudeSessionID, res[2]["session_id"], "the same Claude session continued")

	turns := userTurns(b.fake)
	require.Equal(t, []string{"remember the number 42", "and remember 7", "one-shot while parked", "what was the number?"}, turns,
		"no input applied twice")
	conv := b.fake.Conversation()
	last := conv[len(conv)-1]
	require.Equal(t, []string{"remember the number 42", "and remember 7", "what was the number?"}, last.UserTexts(), "the resumed turn carries the whole history")
	require.Equal(t, []string{"answer to remember the number 42", "answer to and remember 7"}, last.AssistantTexts())

	// options.resume of the earlier query, same tenant: its history is there.
	b.f.PublishJob("default", mustJSON(t, protocol.Job{ID: "cs-3-followup", Prompt: "and again?", Options: protocol.Options{Resume: "cs-3"}}), nil)
	r = f.Follow("default", "cs-3-followup", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	conv = b.fake.Conversation()
	last = conv[len(conv)-1]
	require.Equal(t, []string{"remember the number 42", "and remember 7", "what was the number?", "and again?"}, last.UserTexts())

	// Another tenant cannot resume it, by query id or by session id.
	for i, ref := range []string{"cs-3", parked.ClaudeSessionID} {
		id := "steal-" + fleettest.Itoa(i)
		b.f.PublishJob("other", mustJSON(t, protocol.Job{ID: id, Prompt: "tell me", Options: protocol.Options{Resume: ref}}), nil)
		r = f.Follow("other", id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State)
		require.Equal(t, protocol.CodeResumeNotFound, r.Final.Error.Code)
	}
	require.Len(t, b.fake.Conversation(), len(conv), "a refused resume never reached the model")
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	bb, err := json.Marshal(v)
	require.NoError(t, err)
	return bb
}
