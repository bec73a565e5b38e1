package session_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// guard bounds waits so a broken session fails instead of hanging; it is
// not a performance assertion.
const guard = 2 * time.Minute

type testBundle struct {
	fake     *anthropicfake.Server
	provider *sandbox.Local
	claude   string

	mu    sync.Mutex
	lines []agent.Line
	reqs  chan session.Request
	net   *sandbox.Network // contained runs: the forward to the fake
}

func setup(t *testing.T, reply anthropicfake.ReplyFunc) *testBundle {
	t.Helper()
	b := &testBundle{claude: claudetest.Path(t), reqs: make(chan session.Request, 8)}
	b.fake = anthropicfake.New(t, reply)
	env := b.fake.Env()
	env["IS_SANDBOX"] = "1" // bypassPermissions as root
	cfg := sandbox.LocalConfig{Root: t.TempDir(), Env: env}
	if contained(t) {
		// TestContainedSessions: the CLI reaches the fake only through
		// a forward, as the worker's model forward.
		cfg.Isolation = sandbox.IsolationContained
		b.net, env["ANTHROPIC_BASE_URL"] = containedNetwork(t, env["ANTHROPIC_BASE_URL"])
	}
	p, err := sandbox.NewLocal(cfg)
	require.NoError(t, err)
	b.provider = p
	return b
}

func (b *testBundle) sandbox(t *testing.T) sandbox.Sandbox {
	t.Helper()
	sb, err := b.provider.Create(t.Context(), sandbox.Spec{ID: "sb-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36), Network: b.net})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

func (b *testBundle) start(t *testing.T, sb sandbox.Sandbox, job *protocol.Job, resume string) *session.Session {
	t.Helper()
	s, err := session.Start(t.Context(), session.Config{Command: []string{b.claude}, ExitGrace: 30 * time.Second}, session.Spec{
		Sandbox: sb, Job: job, Resume: resume, ProcID: "session-" + strconv.FormatUint(runSeq.Add(1), 10),
		OnRequest: func(r session.Request) { b.reqs <- r },
	}, func(l agent.Line) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.lines = append(b.lines, agent.Line{Raw: append([]byte(nil), l.Raw...), Msg: protocol.ParseMessage(append([]byte(nil), l.Raw...))})
		return nil
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func (b *testBundle) types() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range b.lines {
		out = append(out, l.Msg.Type)
	}
	return out
}

func turn(t *testing.T, s *session.Session, text string) agent.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	out, err := s.Turn(ctx, session.Input{Text: text})
	require.NoError(t, err)
	require.NotNil(t, out.Result)
	return out
}

func echo(r *anthropicfake.Request) anthropicfake.Reply {
	return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
}

func resultText(r *protocol.Result) string {
	if r == nil || r.Result == nil {
		return ""
	}
	return *r.Result
}

func TestTwoTurnsCarryHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, echo)
	s := b.start(t, b.sandbox(t), &protocol.Job{ID: "s1", Session: &protocol.Session{}}, "")
	out := turn(t, s, "first question")
	require.False(t, out.Result.IsError)
	require.Equal(t, "answer to first question", resultText(out.Result))
	require.NotEmpty(t, s.SessionID())
	out = turn(t, s, "second question")
	require.Equal(t, "answer to second question", resultText(out.Result))
	require.Equal(t, 2, s.Turns())

	conv := b.fake.Conversation()
	require.Len(t, conv, 2)
	require.Equal(t, []string{"first question", "second question"}, conv[1].UserTexts())
	require.Equal(t, []string{"answer to first question"}, conv[1].AssistantTexts())
	// The process stayed up between the turns: one init line per turn, one session.
	require.Equal(t, 2, strings.Count(strings.Join(b.types(), ","), "result"))

	require.NoError(t, s.Close(t.Context()))
	require.NotNil(t, s.ExitStatus())
	require.Equal(t, 0, s.ExitStatus().Code)
}

func TestInterruptEndsTheTurnNotTheSession(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	started := make(chan struct{}, 1)
	b := setup(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "slow" {
			started <- struct{}{}
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("partial"), anthropicfake.Text("rest")}, Hold: hold}
		}
		return echo(r)
	})
	defer close(hold)
	s := b.start(t, b.sandbox(t), &protocol.Job{ID: "s2", Session: &protocol.Session{}}, "")
	done := make(chan agent.Outcome, 1)
	go func() {
		out, err := s.Turn(context.Background(), session.Input{Text: "slow"})
		if err == nil {
			done <- out
		}
		close(done)
	}()
	select {
	case <-started:
	case <-time.After(guard):
		t.Fatal("the slow request never reached the API")
	}
	require.NoError(t, s.Interrupt())
	var out agent.Outcome
	select {
	case out = <-done:
	case <-time.After(guard):
		t.Fatal("the interrupted turn did not end")
	}
	require.NotNil(t, out.Result)
	require.True(t, out.Result.IsError)
	require.False(t, out.Synthetic, "the agent itself ends an interrupted turn")
	require.Contains(t, b.types(), "control_response")
	// The session goes on.
	out = turn(t, s, "after")
	require.Equal(t, "answer to after", resultText(out.Result))
}

// TestApprovalsAllowAndDeny: with remote approvals the agent asks before
// using a tool; allow runs it, deny does not.
func TestApprovalsAllowAndDeny(t *testing.T) {
	t.Parallel()
	// The tool's files go to a directory of the test's, or contained
	// (where no such directory is visible) to the sandbox's own.
	var dirOf atomic.Pointer[string]
	b := setup(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		dir := *dirOf.Load()
		last := r.Messages[len(r.Messages)-1]
		if strings.Contains(string(last.Content), "tool_result") {
			res := r.ToolResults()
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("tool result: " + res[len(res)-1])}}
		}
		name := r.LastUserText()
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{
			"command": "touch " + dir + "/" + name + " && echo made-" + name, "description": "make a file"})}}
	})
	sb := b.sandbox(t)
	dir := t.TempDir()
	if contained(t) {
		dir = sb.(sandbox.HostWorkDir).HostWorkDir()
	}
	dirOf.Store(&dir)
	s := b.start(t, sb, &protocol.Job{ID: "s3", Session: &protocol.Session{Approvals: protocol.ApprovalsRemote}}, "")

	for _, allow := range []bool{true, false} {
		name := "denied"
		if allow {
			name = "allowed"
		}
		done := make(chan agent.Outcome, 1)
		go func() {
			out, _ := s.Turn(context.Background(), session.Input{Text: name})
			done <- out
		}()
		var req session.Request
		select {
		case req = <-b.reqs:
		case <-time.After(guard):
			t.Fatal("no permission request")
		}
		require.Equal(t, "Bash", req.ToolName)
		require.Len(t, s.Pending(), 1)
		require.ErrorIs(t, s.Respond("no-such-request", true, "", nil), session.ErrUnknownRequest)
		require.NoError(t, s.Respond(req.RequestID, allow, "not now", nil))
		require.Empty(t, s.Pending())
		out := <-done
		require.NotNil(t, out.Result)
		_, err := os.Stat(dir + "/" + name)
		if allow {
			require.NoError(t, err, "allowed tool did not run")
			require.Contains(t, resultText(out.Result), "made-allowed")
		} else {
			require.ErrorIs(t, err, os.ErrNotExist, "denied tool ran")
			require.NotContains(t, resultText(out.Result), "made-denied")
		}
	}
}

// TestResumeFromSessionFileInAnotherSandbox: the transcript read out of one
// sandbox and restored into another lets --resume continue with the whole
// history.
func TestResumeFromSessionFileInAnotherSandbox(t *testing.T) {
	t.Parallel()
	b := setup(t, echo)
	sb1 := b.sandbox(t)
	s := b.start(t, sb1, &protocol.Job{ID: "s4", Session: &protocol.Session{}}, "")
	turn(t, s, "remember 42")
	sid := s.SessionID()
	require.NoError(t, s.Close(t.Context()))
	data, err := session.SessionFile(t.Context(), sb1, sid)
	require.NoError(t, err)
	require.Contains(t, string(data), "remember 42")

	sb2 := b.sandbox(t)
	_, err = session.SessionFile(t.Context(), sb2, sid)
	require.ErrorIs(t, err, session.ErrNoSessionFile)
	require.NoError(t, session.Restore(t.Context(), sb2, sid, data))
	s2 := b.start(t, sb2, &protocol.Job{ID: "s4", Session: &protocol.Session{}}, sid)
	out := turn(t, s2, "what was it?")
	require.Equal(t, sid, out.Result.SessionID)
	conv := b.fake.Conversation()
	last := conv[len(conv)-1]
	require.Equal(t, []string{"remember 42", "what was it?"}, last.UserTexts())
	require.Equal(t, []string{"answer to remember 42"}, last.AssistantTexts())
}

func TestCancelStopsTheProcessWithASyntheticResult(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	defer close(hold)
	started := make(chan struct{}, 1)
	b := setup(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		started <- struct{}{}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("a"), anthropicfake.Text("b")}, Hold: hold}
	})
	s := b.start(t, b.sandbox(t), &protocol.Job{ID: "s5", Session: &protocol.Session{}}, "")
	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		<-started
		cancel(agent.ErrCancelled)
	}()
	out, err := s.Turn(ctx, session.Input{Text: "x"})
	require.NoError(t, err)
	require.True(t, out.Synthetic)
	require.Equal(t, protocol.ReasonCancelled, out.Reason)
	select {
	case <-s.Exited():
	default:
		t.Fatal("the process still runs after a cancel")
	}
	_, err = s.Turn(t.Context(), session.Input{Text: "more"})
	require.Error(t, err)
	var last map[string]any
	b.mu.Lock()
	require.NoError(t, json.Unmarshal(b.lines[len(b.lines)-1].Raw, &last))
	b.mu.Unlock()
	require.Equal(t, "result", last["type"])
}
