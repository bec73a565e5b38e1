package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/pkg/gateway"
)

// agent is the real Claude Code CLI, started the way a worker starts it
// behind the gateway: its environment holds the gateway's URL and the
// run's token, nothing of the worker's.
type agent struct {
	t     *testing.T
	cmd   *exec.Cmd
	dir   string
	stdin io.WriteCloser
	lines chan map[string]any
	exit  chan error
}

func startAgent(t *testing.T, baseURL, token string, args ...string) *agent {
	t.Helper()
	bin := claudetest.Path(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"-p", "--output-format", "stream-json", "--verbose"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "CLAUDE_CONFIG_DIR=" + filepath.Join(dir, ".claude"),
		"ANTHROPIC_BASE_URL=" + baseURL, "ANTHROPIC_API_KEY=" + token,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "IS_SANDBOX=1",
	}
	for _, s := range append(append([]string{}, cmd.Env...), cmd.Args...) {
		require.NotContains(t, s, realKey, "the worker's key is in the agent's environment or argv")
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	a := &agent{t: t, cmd: cmd, dir: dir, stdin: stdin, lines: make(chan map[string]any, 1000), exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			a.lines <- m
		}
		close(a.lines)
		a.exit <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-a.exit
		a.exit <- nil
	})
	return a
}

func (a *agent) send(text string) {
	b, _ := json.Marshal(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": text}, "parent_tool_use_id": nil, "session_id": ""})
	_, err := a.stdin.Write(append(b, '\n'))
	require.NoError(a.t, err)
}

// result waits for the next result line.
func (a *agent) result() map[string]any {
	a.t.Helper()
	for {
		m, ok := <-a.lines
		if !ok {
			a.t.Fatal("the CLI exited before a result")
		}
		if m["type"] == "result" {
			return m
		}
	}
}

// wait waits for the CLI to exit.
func (a *agent) wait() error {
	a.t.Helper()
	for range a.lines {
	}
	err := waitOrTimeout(a.t, a.exit)
	a.exit <- err
	return err
}

// noKeyInFiles checks that nothing the CLI wrote holds the worker's key.
func (a *agent) noKeyInFiles() {
	a.t.Helper()
	require.NoError(a.t, filepath.WalkDir(a.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil // sockets and the like
		}
		require.NotContains(a.t, string(b), realKey, p)
		return nil
	}))
}

// everyCallMetered checks that each request the upstream saw carried the
// worker's key and has its .model event, numbered from 1.
func (b *testBundle) everyCallMetered(t *testing.T, token string) []gateway.Event {
	t.Helper()
	reqs := b.fake.Requests()
	require.NotEmpty(t, reqs)
	var evs []gateway.Event
	for i, r := range reqs {
		require.Equal(t, realKey, r.Header.Get("X-Api-Key"))
		for k, vs := range r.Header {
			require.NotContains(t, strings.Join(vs, " "), token, k)
		}
		ev := waitOrTimeout(t, b.events).ev
		require.Equal(t, i+1, ev.Call)
		require.Equal(t, 200, ev.Status)
		require.Positive(t, ev.CostUSD)
		evs = append(evs, ev)
	}
	require.Empty(t, b.events, "more events than calls")
	return evs
}

func TestRealCLIOneShotThroughTheGateway(t *testing.T) {
	t.Parallel()
	b := setup(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
	})
	token, base := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "one", Attempt: 1})
	a := startAgent(t, base, token, "hello gateway")
	require.NoError(t, a.stdin.Close())
	res := a.result()
	require.Equal(t, false, res["is_error"], "result: %v", res)
	require.Equal(t, "answer to hello gateway", res["result"])
	require.NoError(t, a.wait())
	evs := b.everyCallMetered(t, token)
	sum := b.gw.Close(token)
	require.Equal(t, len(evs), sum.Calls)
	total := 0.0
	for _, ev := range evs {
		total += ev.CostUSD
	}
	require.InDelta(t, total, sum.CostUSD, 1e-12)
	a.noKeyInFiles()
}

func TestRealCLITwoTurnSessionThroughTheGateway(t *testing.T) {
	t.Parallel()
	b := setup(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if r.LastUserText() == "run it" {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo tool-ran"})}}
		}
		if len(r.ToolResults()) > 0 && r.Messages[len(r.Messages)-1].Role == "user" && len(r.UserTexts()) == 2 {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("tool said " + r.ToolResults()[0])}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("answer to " + r.LastUserText())}}
	})
	token, base := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "sess", Attempt: 1})
	a := startAgent(t, base, token, "--input-format", "stream-json", "--allowedTools", "Bash")
	a.send("hello one")
	require.Equal(t, "answer to hello one", a.result()["result"])
	a.send("run it")
	require.Contains(t, a.result()["result"], "tool-ran")
	require.NoError(t, a.stdin.Close())
	require.NoError(t, a.wait())
	require.Len(t, b.fake.Conversation(), 3)
	evs := b.everyCallMetered(t, token)
	require.Len(t, evs, len(b.fake.Requests()))
	a.noKeyInFiles()
}

func TestRealCLIStopsAtTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, func(*anthropicfake.Request) anthropicfake.Reply {
		// Each answer asks for a tool, so the CLI would call again and again.
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": "echo again"})},
			Usage: &anthropicfake.Usage{InputTokens: 10_000, OutputTokens: 1000}}
	})
	caps := make(chan gateway.Cap, 1)
	// One call costs far more than the cap at any model's price but haiku's.
	token, base := b.gw.Open(gateway.RunInfo{Tenant: "acme", QueryID: "capped", Attempt: 1, MaxCostUSD: 0.001,
		OnCap: func(c gateway.Cap) { caps <- c }})
	a := startAgent(t, base, token, "--allowedTools", "Bash", "--model", "claude-opus-5-5", "loop forever")
	require.NoError(t, a.stdin.Close())
	res := a.result()
	require.Equal(t, true, res["is_error"])
	require.Contains(t, res["result"], "max_cost_usd")
	require.Equal(t, float64(402), res["api_error_status"])
	require.Error(t, a.wait(), "the CLI exits with an error")
	c := waitOrTimeout(t, caps)
	require.Equal(t, gateway.CapMaxCost, c.Reason)
	require.Len(t, b.fake.Requests(), 1, "a call past the cap reached the upstream")
	b.everyCallMetered(t, token)
}
