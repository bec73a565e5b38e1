package anthropicfake_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
)

type cli struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
}

func startCLI(t *testing.T, fake *anthropicfake.Server, args ...string) *cli {
	t.Helper()
	bin := claudetest.Path(t)
	dir := t.TempDir()
	argv := append([]string{"-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--replay-user-messages"}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CLAUDE_CONFIG_DIR="+dir+"/.claude", "HOME="+dir)
	for k, v := range fake.Env() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &cli{t: t, cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 1000)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			c.lines <- m
		}
		close(c.lines)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

func (c *cli) send(text string) {
	b, _ := json.Marshal(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": text}, "parent_tool_use_id": nil, "session_id": ""})
	_, err := c.stdin.Write(append(b, '\n'))
	require.NoError(c.t, err)
}

func (c *cli) untilResult() []map[string]any {
	var out []map[string]any
	tm := time.After(60 * time.Second)
	for {
		select {
		case m, ok := <-c.lines:
			if !ok {
				c.t.Fatal("CLI exited before a result")
			}
			out = append(out, m)
			if m["type"] == "result" {
				return out
			}
		case <-tm:
			c.t.Fatal("no result")
		}
	}
}

// TestRealCLITwoTurns runs the pinned CLI in stream-json input mode against
// the fake: two turns in one process, the second request carrying the first
// turn's exchange, and a tool_use block the CLI runs (Bash, allowed).
func TestRealCLITwoTurns(t *testing.T) {
	t.Parallel()
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "run it" {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo fake-tool-ran"})}}
		}
		if res := r.ToolResults(); len(res) > 0 && r.Messages[len(r.Messages)-1].Role == "user" && len(r.UserTexts()) == 2 {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("tool said " + res[len(res)-1])}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
	})
	c := startCLI(t, fake, "--allowedTools", "Bash")
	c.send("hello one")
	lines := c.untilResult()
	require.Equal(t, "init", lines[0]["subtype"])
	require.Equal(t, "answer to hello one", lines[len(lines)-1]["result"])
	c.send("run it")
	lines = c.untilResult()
	require.Contains(t, lines[len(lines)-1]["result"], "fake-tool-ran")

	conv := fake.Conversation()
	require.Len(t, conv, 3)
	require.Equal(t, []string{"hello one"}, conv[0].UserTexts())
	require.Equal(t, []string{"hello one", "run it"}, conv[1].UserTexts())
	require.Equal(t, []string{"answer to hello one"}, conv[1].AssistantTexts())
	require.Len(t, conv[2].ToolResults(), 1)
	require.Contains(t, conv[2].ToolResults()[0], "fake-tool-ran")
	for _, r := range conv {
		require.True(t, r.Stream)
	}
	_ = c.stdin.Close()
	require.NoError(t, c.cmd.Wait())
}
