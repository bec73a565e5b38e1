package e2e

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// A job for a provider no worker has fails at once, on its first attempt,
// with a status that names the provider; a provider another worker has
// (--other-sandboxes) is handed back to it (issue 8.6).
func TestJobNoWorkerCanRunFailsAtOnceWithItsReason(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)

	b, err := json.Marshal(protocol.Job{ID: "no-cf", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "no-cf", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, 1, r.Final.Attempt, "failed on its first delivery, not after max_deliveries")
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeSpawnFailed, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, `sandbox "cloudflare" is not configured on this worker`)
	for _, ev := range r.Statuses {
		require.NotEqual(t, protocol.StateRetrying, ev.State, "never retried")
	}
	res, err := protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).AsResult()
	require.NoError(t, err, "the stream still ends with a result line")
	require.Equal(t, protocol.ReasonSpawnFailed, res.XFleet.Reason)

	// With --other-sandboxes cloudflare the same job waits for a worker
	// that has the provider, and runs there.
	g := fleettest.New(t, fleettest.Opts{})
	local := g.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.OtherSandboxes = []string{protocol.SandboxCloudflare}
	}})
	fleettest.WaitReady(t, local.W)
	b, err = json.Marshal(protocol.Job{ID: "elsewhere", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	require.NoError(t, err)
	g.PublishJob("default", b, nil)
	fake := bridgefake.New(t, bridgefake.Options{})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	remote := g.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
	}})
	fleettest.WaitReady(t, remote.W)
	require.Equal(t, protocol.StateSucceeded, g.Follow("default", "elsewhere", wait).Final.State)
}
