package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// TestStandinSessionOnCloudflare: a two-turn session with the stand-in on
// the Cloudflare provider over the fake bridge, the input's stdin write
// answered 503 after it was applied: the retry does not apply it twice, so
// there are exactly two turns; end gives one succeeded status.
func TestStandinSessionOnCloudflare(t *testing.T) {
	t.Parallel()
	fake := bridgefake.New(t, bridgefake.Options{})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
		c.DefaultSandbox = protocol.SandboxCloudflare
	}})
	fleettest.WaitReady(t, w.W)
	sw := watchStatus(t, f, "default", "cfs-1")
	submitSession(t, f, "default", "cfs-1", "first prompt", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	fake.FailStdinWrites(1, true)
	sendCtl(t, f, "default", "cfs-1", input("second input"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "cfs-1", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "cfs-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "reason: %s", r.Final.Error)
	require.Equal(t, 2, r.Final.Turn)
	require.Len(t, results(r), 2)
	var replays []string
	for _, l := range r.Lines {
		if strings.Contains(string(l.Data), `"isReplay":true`) {
			replays = append(replays, string(l.Data))
		}
	}
	require.Len(t, replays, 2, "each input applied once")
	require.Contains(t, replays[0], "first prompt")
	require.Contains(t, replays[1], "second input")
	// The prompt, the input, and the input's retry after the lost answer.
	require.GreaterOrEqual(t, fake.StdinWrites("session-1"), 3)
	require.GreaterOrEqual(t, fake.Creates(), 1, "the session ran on the Cloudflare provider")
}
