package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// --repo-cache-trees keeps one prepared tree per repository by default,
// reads FLEET_REPO_CACHE_TREES, and is refused out of its bounds before
// the worker connects.
func TestRepoCacheTreesFlag(t *testing.T) {
	o, _, ok := parse(nil)
	require.True(t, ok)
	require.Equal(t, 1, o.repoCacheTrees)
	t.Setenv("FLEET_REPO_CACHE_TREES", "0")
	o, _, ok = parse(nil)
	require.True(t, ok)
	require.Equal(t, 0, o.repoCacheTrees)
	o, _, ok = parse([]string{"--repo-cache-trees", "3"})
	require.True(t, ok)
	require.Equal(t, 3, o.repoCacheTrees, "the flag wins over the variable")

	for _, bad := range []string{"-1", "17"} {
		code, _, errOut := fleettest.StartCommand(t, workerArgs(t, "--repo-cache-trees", bad, "--nats-url", "nats://127.0.0.1:1")...).Wait(t)
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "--repo-cache-trees must be between 0 and 16, not "+bad)
		require.NotContains(t, errOut, "waiting for NATS", "refused before connecting")
	}
}
