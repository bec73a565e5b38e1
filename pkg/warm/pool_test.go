package warm_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

func standinCommand(t *testing.T) []string {
	exe, err := os.Executable()
	require.NoError(t, err)
	return []string{exe, childFlag}
}

var plain = func() warm.Profile {
	p, cold := warm.ProfileOf(&protocol.Job{ID: "x", Prompt: "x"}, warm.Placement{Sandbox: "local"})
	if cold != "" {
		panic(cold)
	}
	return p
}()

// A taken agent answers its first user message (the job's prompt), is
// bound to its run before that, is never handed out again, and the pool
// fills back up to N.
func TestTakeHandsOutAWaitingAgentThatAnswersThePrompt(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, standinCommand(t), nil)
	pool, events := newPool(t, warm.Config{N: 2, Spawn: s.spawn, Profiles: []warm.Profile{plain}, Handshake: true})
	await(t, events, warm.EventReady, 2)
	require.Equal(t, 2, pool.Ready(plain))

	a, ok := pool.Take(plain)
	require.True(t, ok)
	b, ok := pool.Take(plain)
	require.True(t, ok)
	require.NotSame(t, a, b, "each agent is handed out once")
	s.mu.Lock()
	for token, run := range s.tokens {
		require.Empty(t, run, "token %s is bound to nothing before Begin", token)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	require.NoError(t, a.Begin(ctx, warm.Run{Tenant: "acme", ID: "q1"}, "hello warm world", true))
	require.ErrorIs(t, a.Begin(ctx, warm.Run{Tenant: "acme", ID: "q2"}, "again", true), warm.ErrBegun)
	lines, result := readUntilResult(t, a)
	require.Equal(t, "success", result["subtype"])
	raw, err := json.Marshal(lines)
	require.NoError(t, err)
	require.Contains(t, string(raw), "hello warm world", "the agent answered the prompt")
	require.Equal(t, "init", lines[0]["subtype"], "the first line after the prompt is the agent's init")

	bound := 0
	s.mu.Lock()
	for _, run := range s.tokens {
		if run == "q1" {
			bound++
		}
	}
	s.mu.Unlock()
	require.Equal(t, 1, bound, "Begin bound exactly one token, to q1")

	// Bind binds b without writing to it; Begin after it is refused.
	require.NoError(t, b.Bind(ctx, warm.Run{Tenant: "acme", ID: "q3"}))
	require.ErrorIs(t, b.Begin(ctx, warm.Run{Tenant: "acme", ID: "q4"}, "x", true), warm.ErrBegun)
	s.mu.Lock()
	boundQ3 := slices.Contains(slices.Collect(maps.Values(s.tokens)), "q3")
	s.mu.Unlock()
	require.True(t, boundQ3, "Bind bound b's token to q3")

	require.NoError(t, a.Close(ctx))
	require.NoError(t, b.Close(ctx))
	await(t, events, warm.EventReady, 2)
	require.Equal(t, 2, pool.Ready(plain), "the pool filled back up")
	require.Equal(t, 4, len(s.processes()))
}

// A warm agent that dies while it waits is dropped and replaced.
func TestADeadWarmAgentIsReplaced(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, standinCommand(t), nil)
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, Profiles: []warm.Profile{plain}})
	await(t, events, warm.EventReady, 1)
	first := s.processes()[0]
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	require.NoError(t, first.Stop(ctx, 0))
	await(t, events, warm.EventDied, 1)
	await(t, events, warm.EventReady, 1)
	require.Len(t, s.processes(), 2)
	a, ok := pool.Take(plain)
	require.True(t, ok)
	require.Same(t, s.processes()[1], a.Process(), "the replacement is handed out, not the dead one")
	require.NoError(t, a.Close(ctx))
}

// Stop stops every agent that was not taken, and releases its sandbox.
func TestStopStopsEveryWarmAgent(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, standinCommand(t), nil)
	other := plain
	other.Model = "claude-other"
	pool, err := warm.New(warm.Config{N: 2, Spawn: s.spawn, Profiles: []warm.Profile{plain, other}})
	require.NoError(t, err)
	events := pool.Events()
	require.NoError(t, pool.Start(t.Context()))
	await(t, events, warm.EventReady, 4)
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	require.NoError(t, pool.Stop(ctx))
	for _, p := range s.processes() {
		_, err := p.Wait(ctx)
		require.NoError(t, err, "the agent exited")
	}
	require.Equal(t, 4, s.released)
	_, ok := pool.Take(plain)
	require.False(t, ok, "a stopped pool hands out nothing")
}

// A spawn that fails is retried; the pool still fills.
func TestAFailedSpawnIsRetried(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, standinCommand(t), nil)
	s.fail = 2
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, Profiles: []warm.Profile{plain}, Backoff: time.Millisecond})
	await(t, events, warm.EventSpawnFailed, 2)
	await(t, events, warm.EventReady, 1)
	require.Equal(t, 1, pool.Ready(plain))
}

// Take of a profile nobody asked for yet starts cold but keeps the
// profile warm for the next job; past MaxProfiles the least recently
// used profile's agents are stopped.
func TestTakeKeepsNewProfilesWarmWithinBounds(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, standinCommand(t), nil)
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, MaxProfiles: 1})
	_, ok := pool.Take(plain)
	require.False(t, ok)
	await(t, events, warm.EventReady, 1)
	require.Equal(t, 1, pool.Ready(plain))
	other := plain
	other.PermissionMode = "plan"
	_, ok = pool.Take(other)
	require.False(t, ok)
	await(t, events, warm.EventReady, 1)
	require.Equal(t, 0, pool.Ready(plain), "the older profile made room")
	a, ok := pool.Take(other)
	require.True(t, ok)
	require.True(t, strings.Contains(strings.Join(other.Argv([]string{"c"}), " "), "--permission-mode plan"))
	require.NoError(t, a.Close(t.Context()))
}

// An agent that never answers the handshake is stopped when its spawn
// times out, and counts as a failed spawn (retried); nothing is listed.
func TestAnAgentThatNeverAnswersIsNotListed(t *testing.T) {
	t.Parallel()
	s := newSpawner(t, []string{"sh", "-c", "exec sleep 3600", "mute"}, nil)
	pool, events := newPool(t, warm.Config{N: 1, Spawn: s.spawn, Profiles: []warm.Profile{plain},
		Handshake: true, SpawnTimeout: 300 * time.Millisecond, Backoff: time.Millisecond})
	for n := 0; n < 2; {
		select {
		case ev := <-events:
			require.NotEqual(t, warm.EventReady, ev.Kind)
			if ev.Kind == warm.EventSpawnFailed {
				require.ErrorContains(t, ev.Err, "did not answer its handshake")
				n++
			}
		case <-time.After(guard):
			t.Fatal("no failed spawns")
		}
	}
	require.Equal(t, 0, pool.Ready(plain))
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	first := s.processes()[0]
	_, err := first.Wait(ctx)
	require.NoError(t, err, "the mute agent was stopped")
}
