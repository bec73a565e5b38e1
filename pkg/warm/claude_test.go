package warm_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

func claudeSpawner(t *testing.T, fake *anthropicfake.Server) *spawner {
	env := fake.Env()
	env["IS_SANDBOX"] = "1"
	return newSpawner(t, []string{claudetest.Path(t)}, env)
}

// The real CLI, started warm (handshake answered, waiting for its first
// input), answers the job's prompt through the fake API.
func TestRealCLIWarmAgentAnswersItsFirstMessage(t *testing.T) {
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("warm answer to " + r.LastUserText())}}
	})
	s := claudeSpawner(t, fake)
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, Profiles: []warm.Profile{plain}, Handshake: true})
	await(t, events, warm.EventReady, 1)
	require.Empty(t, fake.Conversation(), "a warm agent calls no model before its first message")
	a, ok := pool.Take(plain)
	require.True(t, ok)
	defer func() { require.NoError(t, a.Close(context.Background())) }()
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	require.NoError(t, a.Begin(ctx, warm.Run{Tenant: "acme", ID: "q1"}, "what is warm?", true))
	lines, result := readUntilResult(t, a)
	require.Equal(t, "system", lines[0]["type"], "the first line after the prompt is init, not the handshake's answer")
	require.Equal(t, "success", result["subtype"])
	require.Equal(t, "warm answer to what is warm?", result["result"])
	st, err := a.Process().Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, "the CLI exits at the end of its input: %s", st.StderrTail)
}

// Idle warm agents of the real CLI block on their stdin: over an idle
// window they use no CPU (a few ticks at most, for the runtime's own
// housekeeping). The window is a measurement, not a wait for an event.
func TestIdleWarmAgentsCostNoCPU(t *testing.T) {
	fake := anthropicfake.New(t, nil)
	s := claudeSpawner(t, fake)
	const n = 2
	_, events := newPool(t, warm.Config{N: n, Spawn: s.spawn, Profiles: []warm.Profile{plain}, Handshake: true})
	await(t, events, warm.EventReady, n)
	s.mu.Lock()
	dirs := append([]string(nil), s.dirs...)
	s.mu.Unlock()
	// Let the CLIs finish what they do after the handshake (timers set at
	// start), then measure.
	time.Sleep(2 * time.Second)
	t0, procs := cpuTicks(t, dirs)
	require.GreaterOrEqual(t, procs, n, "the agents' processes are found by their working directory")
	time.Sleep(5 * time.Second)
	t1, _ := cpuTicks(t, dirs)
	t.Logf("%d idle warm agents (%d processes) used %d ticks in 5 s", n, procs, t1-t0)
	// The bound: 2 ticks (20 ms) a second per agent, 2% of a core, far
	// below an agent that polls or spins (100 ticks a second). The pinned
	// CLI's own timers were measured at 0.3 to 1.5 ticks a second per idle
	// agent on machines of this kind, the higher on 2026-12-07.
	require.LessOrEqual(t, t1-t0, int64(n*2*5), "idle warm agents used CPU: %d ticks in 5 s", t1-t0)
	require.Empty(t, fake.Conversation(), "no model call while idle")
}

// Why jobs with a workspace start cold: the CLI reads its working
// directory's CLAUDE.md while it starts, and not again at its first
// input, so a checkout made after a warm agent started would go unseen.
// If a later CLI reads it at its first input, this test fails, and warm
// agents could serve workspace jobs (checkout after Take).
func TestTheCLIReadsItsCheckoutOnlyWhileItStarts(t *testing.T) {
	fake := anthropicfake.New(t, nil)
	s := claudeSpawner(t, fake)
	var dir string
	s.prepare = func(d string) {
		dir = d
		require.NoError(t, os.WriteFile(filepath.Join(d, "CLAUDE.md"), []byte("MARKER-BEFORE-START\n"), 0o644))
	}
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, Profiles: []warm.Profile{plain}, Handshake: true})
	await(t, events, warm.EventReady, 1)
	a, ok := pool.Take(plain)
	require.True(t, ok)
	defer func() { require.NoError(t, a.Close(context.Background())) }()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "CLAUDE.md"), []byte("MARKER-AFTER-START\n"), 0o644))
	require.NoError(t, a.Begin(t.Context(), warm.Run{Tenant: "acme", ID: "q"}, "hi", true))
	readUntilResult(t, a)
	var bodies strings.Builder
	for _, r := range fake.Conversation() {
		b, err := json.Marshal(r.Body)
		require.NoError(t, err)
		bodies.Write(b)
	}
	require.Contains(t, bodies.String(), "MARKER-BEFORE-START", "the CLAUDE.md present at start reached the model")
	require.NotContains(t, bodies.String(), "MARKER-AFTER-START", "the CLAUDE.md written after start did not")
}
