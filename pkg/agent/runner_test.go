package agent_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

type testBundle struct {
	sb    sandbox.Sandbox
	lines *recorder
}

// recorder collects emitted lines (copies) and signals each one.
type recorder struct {
	mu    sync.Mutex
	lines [][]byte
	synth []bool
	got   chan struct{}
	fail  func(n int) error
}

func newRecorder() *recorder { return &recorder{got: make(chan struct{}, 1<<16)} }

func (r *recorder) emit(l agent.Line) error {
	r.mu.Lock()
	n := len(r.lines) + 1
	r.lines = append(r.lines, append([]byte(nil), l.Raw...))
	r.synth = append(r.synth, l.Synthetic)
	fail := r.fail
	r.mu.Unlock()
	r.got <- struct{}{}
	if fail != nil {
		return fail(n)
	}
	return nil
}

func (r *recorder) all() ([][]byte, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lines, r.synth
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	p, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir()})
	require.NoError(t, err)
	sb, err := p.Create(context.Background(), sandbox.Spec{ID: "agent-test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return &testBundle{sb: sb, lines: newRecorder()}
}

func childCommand(t *testing.T, mode string) []string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return []string{exe, childFlag, mode}
}

func newRunner(t *testing.T, mode string, mod func(*agent.Config)) *agent.Runner {
	t.Helper()
	cfg := agent.Config{Command: childCommand(t, mode), ResultGrace: 5 * time.Second, KillGrace: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	r, err := agent.New(cfg)
	require.NoError(t, err)
	return r
}

// runAsync runs r in the background; the channel yields the outcome (a Run
// error fails the test).
func runAsync(t *testing.T, r *agent.Runner, ctx context.Context, req agent.Request, emit agent.EmitFunc) <-chan agent.Outcome {
	t.Helper()
	done := make(chan agent.Outcome, 1)
	go func() {
		out, err := r.Run(ctx, req, emit)
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- out
	}()
	return done
}

func job(prompt string) *protocol.Job {
	return &protocol.Job{ID: "q1", Tenant: "default", Prompt: prompt}
}

func waitLines(t *testing.T, r *recorder, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-r.got:
		case <-deadline:
			t.Fatalf("timed out waiting for line %d", i+1)
		}
	}
}

// requireOneTerminalResult checks the stream ends with exactly one result and
// that it is the last line.
func requireSyntheticLast(t *testing.T, lines [][]byte, synth []bool, reason string) *protocol.Result {
	t.Helper()
	require.NotEmpty(t, lines)
	results := 0
	for _, l := range lines {
		if protocol.ParseMessage(l).IsResult() {
			results++
		}
	}
	require.Equal(t, 1, results, "exactly one result line")
	last := protocol.ParseMessage(lines[len(lines)-1])
	require.True(t, last.IsResult())
	require.True(t, synth[len(synth)-1])
	res, err := last.AsResult()
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Equal(t, "error_during_execution", res.Subtype)
	require.NotNil(t, res.XFleet)
	require.True(t, res.XFleet.Synthetic)
	require.Equal(t, reason, res.XFleet.Reason)
	return res
}

func TestRunReplaysARecordedSessionByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", func(c *agent.Config) { c.Command = append(c.Command, "--standin-replay=read-tool") })
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("hello")}, b.lines.emit)
	require.NoError(t, err)
	want, err := os.ReadFile("../../internal/standin/sessions/read-tool.ndjson")
	require.NoError(t, err)
	lines, synth := b.lines.all()
	var got bytes.Buffer
	for i, l := range lines {
		require.False(t, synth[i])
		got.Write(l)
		got.WriteByte('\n')
	}
	require.Equal(t, string(want), got.String(), "relayed lines must be the agent's bytes, unchanged and in order")
	require.True(t, out.Succeeded())
	require.False(t, out.Synthetic)
	require.Equal(t, uint64(len(lines)), out.Lines)
	require.NotNil(t, out.Exit)
	require.Equal(t, 0, out.Exit.Code)
}

func TestRunPromptGoesOnStdinNotArgv(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "argv", nil)
	turns, budget := 3, 1.5
	sys := "-be terse"
	j := job("--dangerous-flag please")
	j.Options = protocol.Options{Model: "sonnet", MaxTurns: &turns, MaxBudgetUSD: &budget, PermissionMode: "plan",
		AllowedTools: []string{"Read", "Bash(git *)"}, SystemPrompt: &sys, Resume: "abc-123"}
	_, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: j}, b.lines.emit)
	require.NoError(t, err)
	lines, _ := b.lines.all()
	require.NotEmpty(t, lines)
	require.NotContains(t, string(lines[0]), "dangerous-flag", "the prompt must never reach argv")
	require.Contains(t, string(lines[0]), "--resume=abc-123")
	require.Contains(t, string(lines[0]), "--system-prompt=-be terse")
}

func TestBuildArgv(t *testing.T) {
	t.Parallel()
	turns, budget, timeout := 7, 0.25, 60
	sys, app := "sys", "more"
	tests := []struct {
		name string
		opts protocol.Options
		want []string
	}{
		{"none", protocol.Options{}, []string{"claude", "-p", "--output-format", "stream-json", "--verbose"}},
		{"all", protocol.Options{
			Model: "opus", MaxTurns: &turns, MaxBudgetUSD: &budget, PermissionMode: "acceptEdits",
			AllowedTools: []string{"Read", "Edit"}, DisallowedTools: []string{"Bash"}, SystemPrompt: &sys,
			AppendSystemPrompt: &app, Resume: "sess-1", TimeoutS: &timeout, Env: map[string]string{"X": "y"},
		}, []string{
			"claude", "-p", "--output-format", "stream-json", "--verbose",
			"--model", "opus", "--max-turns", "7", "--max-budget-usd", "0.25", "--permission-mode", "acceptEdits",
			"--allowedTools", "Read,Edit", "--disallowedTools", "Bash", "--system-prompt=sys",
			"--append-system-prompt=more", "--resume=sess-1",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, agent.BuildArgv([]string{"claude"}, tt.opts))
		})
	}
}

func TestRunNoResultGetsOneSyntheticResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin noresult=1 exit=3 stderr=100")}, b.lines.emit)
	require.NoError(t, err)
	lines, synth := b.lines.all()
	res := requireSyntheticLast(t, lines, synth, protocol.ReasonProcessExit)
	require.NotNil(t, res.XFleet.ExitCode)
	require.Equal(t, 3, *res.XFleet.ExitCode)
	require.Contains(t, res.XFleet.StderrTail, "eee")
	require.Empty(t, res.TerminalReason, "terminal_reason is only for deliberate cancellation")
	require.True(t, out.Synthetic)
	require.False(t, out.Succeeded())
	require.Equal(t, protocol.ReasonProcessExit, out.Reason)
}

func TestRunResultThenHangIsStoppedAfterGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", func(c *agent.Config) { c.ResultGrace = 100 * time.Millisecond; c.KillGrace = 100 * time.Millisecond })
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin hang=1")}, b.lines.emit)
	require.NoError(t, err)
	require.True(t, out.Succeeded())
	require.False(t, out.Synthetic, "a result was written: no synthetic result")
	require.NotNil(t, out.Exit)
	require.NotEmpty(t, out.Exit.Signal, "the hanging agent was killed")
	lines, synth := b.lines.all()
	require.Len(t, lines, 3)
	require.NotContains(t, synth, true)
}

func TestRunTwoResultsBothRelayedLastWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin results=2")}, b.lines.emit)
	require.NoError(t, err)
	lines, _ := b.lines.all()
	n := 0
	for _, l := range lines {
		if protocol.ParseMessage(l).IsResult() {
			n++
		}
	}
	require.Equal(t, 2, n)
	require.False(t, out.Synthetic)
	require.True(t, out.Succeeded())
}

func TestRunHugeLinePassesIntact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	const size = 12 << 20
	_, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin big=12582912")}, b.lines.emit)
	require.NoError(t, err)
	lines, _ := b.lines.all()
	var found bool
	for _, l := range lines {
		if len(l) > size {
			found = true
			require.Equal(t, byte('}'), l[len(l)-1])
		}
	}
	require.True(t, found, "the 12 MiB line arrives whole")
}

func TestRunLineOverCapIsReplacedByMarker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", func(c *agent.Config) { c.MaxLine = 1 << 20 })
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin big=2097152")}, b.lines.emit)
	require.NoError(t, err)
	require.Equal(t, 1, out.Oversized)
	lines, _ := b.lines.all()
	var marker bool
	for _, l := range lines {
		require.Less(t, len(l), 1<<20)
		if protocol.ParseMessage(l).Type == "x_fleet_line_too_large" {
			marker = true
		}
	}
	require.True(t, marker)
	require.True(t, out.Succeeded(), "the run continues after an oversized line")
}

func TestRunGarbagePassesThroughUnchanged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "garbage", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("x")}, b.lines.emit)
	require.NoError(t, err)
	lines, _ := b.lines.all()
	require.Len(t, lines, 5)
	require.Equal(t, "not json at all", string(lines[0]))
	require.Equal(t, "\x1b[?1004l", string(lines[1]))
	require.Equal(t, `{"broken json`, string(lines[3]))
	require.True(t, out.Succeeded(), "result found although type is not the first key")
}

func TestRunExitBeforeReadingStdin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "no-stdin-exit", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job(strings.Repeat("p", protocol.MaxPromptBytes))}, b.lines.emit)
	require.NoError(t, err)
	lines, synth := b.lines.all()
	res := requireSyntheticLast(t, lines, synth, protocol.ReasonProcessExit)
	require.Equal(t, 3, *res.XFleet.ExitCode)
	require.True(t, out.Synthetic)
}

func TestRunCancelMidRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := runAsync(t, r, ctx, agent.Request{Sandbox: b.sb, Job: job("/standin sleep=1h")}, b.lines.emit)
	waitLines(t, b.lines, 2) // init and the text: the agent is running
	cancel(agent.ErrCancelled)
	out := <-done
	lines, synth := b.lines.all()
	res := requireSyntheticLast(t, lines, synth, protocol.ReasonCancelled)
	require.Equal(t, "aborted_streaming", res.TerminalReason)
	require.Equal(t, protocol.ReasonCancelled, out.Reason)
	require.NotEmpty(t, res.SessionID, "the session id from init is kept")
}

func TestRunCancelKillsAnAgentIgnoringSIGTERM(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "ignore-term", func(c *agent.Config) { c.KillGrace = 200 * time.Millisecond })
	ctx, cancel := context.WithCancelCause(context.Background())
	done := runAsync(t, r, ctx, agent.Request{Sandbox: b.sb, Job: job("x")}, b.lines.emit)
	waitLines(t, b.lines, 1)
	cancel(agent.ErrCancelled)
	out := <-done
	require.NotNil(t, out.Exit)
	require.Equal(t, "SIGKILL", out.Exit.Signal)
	lines, synth := b.lines.all()
	requireSyntheticLast(t, lines, synth, protocol.ReasonCancelled)
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin sleep=1h"), Timeout: 300 * time.Millisecond}, b.lines.emit)
	require.NoError(t, err)
	lines, synth := b.lines.all()
	requireSyntheticLast(t, lines, synth, protocol.ReasonTimeout)
	require.Equal(t, protocol.ReasonTimeout, out.Reason)
}

func TestRunHandbackWritesNoResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := runAsync(t, r, ctx, agent.Request{Sandbox: b.sb, Job: job("/standin sleep=1h")}, b.lines.emit)
	waitLines(t, b.lines, 2)
	cancel(agent.ErrHandback)
	out := <-done
	require.True(t, out.HandedBack)
	require.Nil(t, out.Result)
	lines, _ := b.lines.all()
	for _, l := range lines {
		require.False(t, protocol.ParseMessage(l).IsResult(), "a handed-back run writes no result")
	}
}

func TestRunSpawnFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := agent.New(agent.Config{Command: []string{"/nonexistent/agent-program"}})
	require.NoError(t, err)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("x")}, b.lines.emit)
	require.NoError(t, err)
	lines, synth := b.lines.all()
	require.Len(t, lines, 1)
	requireSyntheticLast(t, lines, synth, protocol.ReasonSpawnFailed)
	require.Equal(t, protocol.ReasonSpawnFailed, out.Reason)
}

func TestRunEmitErrorStopsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("journal full")
	b.lines.fail = func(n int) error {
		if n == 2 {
			return boom
		}
		return nil
	}
	r := newRunner(t, "standin", nil)
	_, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin lines=1000 delay=1ms")}, b.lines.emit)
	require.ErrorIs(t, err, boom)
	lines, _ := b.lines.all()
	require.Len(t, lines, 2, "nothing is emitted after the failure")
}

func TestRunStderrFloodBeforeStdoutDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newRunner(t, "standin", nil)
	out, err := r.Run(context.Background(), agent.Request{Sandbox: b.sb, Job: job("/standin stderr=1048576")}, b.lines.emit)
	require.NoError(t, err)
	require.True(t, out.Succeeded())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := agent.New(agent.Config{})
	require.ErrorContains(t, err, "Command")
	_, err = agent.New(agent.Config{Command: []string{"x"}, MaxLine: 10})
	require.ErrorContains(t, err, "MaxLine")
}

// A result the agent writes after the runner stopped it (Claude Code writes
// result/success when SIGTERM ends its tool) is relayed unchanged, but the
// stop decides the outcome: cancelled, timeout, or handed back.
func TestRunResultWrittenAfterStopDoesNotWin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		cause  error
		reason string
	}{
		{"cancel", agent.ErrCancelled, protocol.ReasonCancelled},
		// The cause the run's own timer gives (Request.Timeout), sent
		// once the agent runs: a timer started with the run could fire
		// before a loaded machine has started the agent (TestRunTimeout
		// covers the timer itself).
		{"timeout", agent.ErrTimeout, protocol.ReasonTimeout},
		{"handback", agent.ErrHandback, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := newRunner(t, "standin", nil)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			req := agent.Request{Sandbox: b.sb, Job: job("/standin termresult=1 sleep=1h")}
			done := runAsync(t, r, ctx, req, b.lines.emit)
			waitLines(t, b.lines, 2) // init and the text: the agent is running
			cancel(tc.cause)
			out := <-done
			lines, synth := b.lines.all()
			require.GreaterOrEqual(t, len(lines), 3)
			late := protocol.ParseMessage(lines[2])
			require.True(t, late.IsResult(), "the agent's late result is relayed")
			require.False(t, synth[2])
			lr, err := late.AsResult()
			require.NoError(t, err)
			require.False(t, lr.IsError, "unchanged: it says success")
			if tc.cause == agent.ErrHandback {
				require.True(t, out.HandedBack, "the hand-back stands")
				require.Nil(t, out.Result)
				require.Len(t, lines, 3, "a handed-back run adds no result of its own")
				return
			}
			require.False(t, out.HandedBack)
			require.True(t, out.Synthetic)
			require.Equal(t, tc.reason, out.Reason)
			require.True(t, out.Result.IsError)
			require.Len(t, lines, 4)
			last := protocol.ParseMessage(lines[3])
			require.True(t, synth[3])
			res, err := last.AsResult()
			require.NoError(t, err)
			require.Equal(t, tc.reason, res.XFleet.Reason)
		})
	}
}
