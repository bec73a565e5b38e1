package worker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
)

// The model's variables are the worker's: the gateway's URL and the run's
// token, never a job's, so the operator's allow-list may not list them.
func TestModelEnvIsReserved(t *testing.T) {
	for _, n := range []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN", "anthropic_api_key", "ANTHROPIC_BASE_URL"} {
		require.True(t, worker.ReservedModelEnv(n), n)
	}
	for _, n := range []string{"ANTHROPIC_MODEL", "PATH", "ENABLE_TOOL_SEARCH", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"} {
		require.False(t, worker.ReservedModelEnv(n), n)
	}

	f := fleettest.New(t, fleettest.Opts{})
	var cfg worker.Config
	f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) { cfg = *c }})
	cfg.EnvAllow = []string{"SOMETHING", "ANTHROPIC_BASE_URL"}
	_, err := worker.New(cfg)
	require.ErrorContains(t, err, "EnvAllow may not list ANTHROPIC_BASE_URL")
}
