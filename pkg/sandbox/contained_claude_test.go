package sandbox_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// claudeContained returns a contained sandbox and the ProcSpec base for the
// real CLI talking to fake through a forward (network "none": the gateway
// is all it reaches).
func claudeContained(t *testing.T, fake *anthropicfake.Server) (sandbox.Sandbox, sandbox.ProcSpec) {
	t.Helper()
	bin := claudetest.Path(t)
	requireContained(t)
	u, err := url.Parse(fake.URL)
	require.NoError(t, err)
	fwd := sandbox.Forward{Port: 18090, To: u.Host}
	n := &sandbox.Network{Policy: egress.Policy{Mode: egress.None}, Forwards: []sandbox.Forward{fwd}}
	env := fake.Env()
	env["ANTHROPIC_BASE_URL"] = "http://" + n.Reach(fwd, true)
	env["IS_SANDBOX"] = "1"
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "claude", env)
	return sb, sandbox.ProcSpec{ID: "claude", Argv: []string{bin}, Network: n}
}

func readLines(t *testing.T, r io.Reader, until func(map[string]any) bool) []map[string]any {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<24)
	var out []map[string]any
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		out = append(out, m)
		if until(m) {
			return out
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func isResult(m map[string]any) bool { return m["type"] == "result" }

// TestContainedClaudeOneShot runs the real CLI contained: it reaches the
// model only through the forward, and its answer comes back.
func TestContainedClaudeOneShot(t *testing.T) {
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("contained answer to " + r.LastUserText())}}
	})
	sb, spec := claudeContained(t, fake)
	spec.Argv = append(spec.Argv, "-p", "--output-format", "stream-json", "--verbose", "say hi")
	p, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	lines := readLines(t, p.Stdout(), func(map[string]any) bool { return false })
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, st.StderrTail)
	require.NotEmpty(t, lines)
	require.Equal(t, "init", lines[0]["subtype"])
	last := lines[len(lines)-1]
	require.Equal(t, "success", last["subtype"])
	require.Equal(t, "contained answer to say hi", last["result"])
	require.Len(t, fake.Conversation(), 1)
}

// TestContainedClaudeTwoTurns runs a stream-json session contained: two
// turns in one process, the second running a Bash tool inside, which
// reports the agent uid.
func TestContainedClaudeTwoTurns(t *testing.T) {
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "run it" {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo uid=$(id -u) && touch made-by-bash"})}}
		}
		if res := r.ToolResults(); len(res) > 0 && len(r.UserTexts()) == 2 {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("tool said " + res[len(res)-1])}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
	})
	sb, spec := claudeContained(t, fake)
	spec.Argv = append(spec.Argv, "-p", "--input-format", "stream-json", "--output-format", "stream-json",
		"--verbose", "--allowedTools", "Bash")
	p, err := sb.(sandbox.Interactive).StartInteractive(testCtx(t), spec)
	require.NoError(t, err)
	send := func(text string) {
		b, _ := json.Marshal(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": text}, "parent_tool_use_id": nil, "session_id": ""})
		_, err := p.Stdin().Write(append(b, '\n'))
		require.NoError(t, err)
	}
	out := bufio.NewReader(p.Stdout())
	send("hello one")
	lines := readLines(t, out, isResult)
	require.Equal(t, "answer to hello one", lines[len(lines)-1]["result"])
	send("run it")
	lines = readLines(t, out, isResult)
	res, _ := lines[len(lines)-1]["result"].(string)
	require.True(t, strings.Contains(res, "uid=1000"), "the Bash tool ran inside as the agent uid: %q", res)
	require.NoError(t, p.Stdin().Close())
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, st.StderrTail)
	_, err = sb.ReadFile(testCtx(t), "made-by-bash")
	require.NoError(t, err, "the tool wrote in the workspace")
	require.Len(t, fake.Conversation(), 3)
}

// TestContainedClaudeResume parks a session and resumes it in a new
// contained process of the same sandbox: the CLI finds its transcript in
// the sandbox's CLAUDE_CONFIG_DIR and sends the earlier exchange again.
func TestContainedClaudeResume(t *testing.T) {
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
	})
	sb, spec := claudeContained(t, fake)
	bin := spec.Argv[0]
	oneShot := func(id string, args ...string) map[string]any {
		s := spec
		s.ID = id
		s.Argv = append([]string{bin, "-p", "--output-format", "stream-json", "--verbose"}, args...)
		p, err := sb.Start(testCtx(t), s)
		require.NoError(t, err)
		lines := readLines(t, p.Stdout(), func(map[string]any) bool { return false })
		st, err := p.Wait(testCtx(t))
		require.NoError(t, err)
		require.Equal(t, 0, st.Code, st.StderrTail)
		return lines[len(lines)-1]
	}
	first := oneShot("turn-1", "first question")
	require.Equal(t, "answer to first question", first["result"])
	sid, _ := first["session_id"].(string)
	require.NotEmpty(t, sid)
	second := oneShot("turn-2", "--resume", sid, "second question")
	require.Equal(t, "answer to second question", second["result"])
	conv := fake.Conversation()
	require.Len(t, conv, 2)
	require.Equal(t, []string{"first question", "second question"}, conv[1].UserTexts(),
		"the resumed process sent the parked exchange")
}
