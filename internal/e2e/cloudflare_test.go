package e2e

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/bridgefake"
)

// The whole fleet once with --sandbox cloudflare, against the Go fake of
// the bridge Worker, with the stream dropped mid-run once.
func TestFleetOnCloudflareSandbox(t *testing.T) {
	t.Parallel()
	fake := bridgefake.New(t, bridgefake.Options{})
	fake.DropStreamAfter(4096, 1)
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client()})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2,
		AgentMod: func(c *agent.Config) { c.Command = append(c.Command, "--standin-replay=tool-use-mcp") },
		Mod: func(c *worker.Config) {
			c.Providers[protocol.SandboxCloudflare] = cf
			c.DefaultSandbox = protocol.SandboxCloudflare
		},
	})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "cf-1", "hello cloudflare")
	r := f.Follow("default", "cf-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	rec, err := os.ReadFile("../standin/sessions/tool-use-mcp.ndjson")
	require.NoError(t, err)
	require.Equal(t, string(rec), string(fleettest.JoinLines(fleettest.RequireContiguous(t, r))),
		"every byte once, in order, although the stream dropped")
	require.GreaterOrEqual(t, fake.StreamConnects("agent-1"), 2, "the dropped stream was resumed")
	require.NoError(t, w.Journal.WaitPersisted(context.Background(), "default", "cf-1"))
	require.Equal(t, string(rec), string(f.Transcript(f.Objects, "default", "cf-1")))
	fleettest.Eventually(t, wait, func() bool { return fake.Deletes() >= 1 }, "the sandbox destroyed at the end")

	// A job may also ask for its provider explicitly.
	b, _ := json.Marshal(protocol.Job{ID: "cf-2", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	f.PublishJob("default", b, nil)
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "cf-2", wait).Final.State)
	require.GreaterOrEqual(t, fake.Creates(), 2)
}

// A bridge answering 503 on create: the job is handed back with a delay
// and succeeds on a later attempt.
func TestCloudflareUnavailableIsRetried(t *testing.T) {
	t.Parallel()
	fake := bridgefake.New(t, bridgefake.Options{})
	fake.FailCreate(1000)
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client(),
		ReadyTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
		c.DefaultSandbox = protocol.SandboxCloudflare
	}})
	fleettest.WaitReady(t, w.W)
	retried := make(chan struct{}, 16)
	sub, err := f.NC.Subscribe(f.Names.QueryStatus("default", "cf-503"), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.State == protocol.StateRetrying {
			retried <- struct{}{}
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	f.SubmitJSON("default", "cf-503", "x")
	select {
	case <-retried:
	case <-time.After(wait):
		t.Fatal("no retrying status while the bridge answers 503")
	}
	fake.FailCreate(0)
	r := f.Follow("default", "cf-503", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.GreaterOrEqual(t, r.Final.Attempt, 2, "the unavailable attempt was retried as a new attempt")
	var retrying bool
	for _, ev := range r.Statuses {
		if ev.State == protocol.StateRetrying && ev.Error != nil && ev.Error.Code == protocol.CodeSandboxUnavailable {
			retrying = true
		}
	}
	require.True(t, retrying, "subscribers see why it is retried")
}

// A worker of this release against the previous release's bridge (no
// version route, no /model routes): the query fails at once, attempt 1,
// with bridge_incompatible naming both versions; it is not retried and no
// sandbox is created. Before, every attempt failed sandbox_unavailable on
// PUT /v1/sb/:id/model (404) until the deliveries ran out, and only the
// worker's log said why.
func TestCloudflareOldBridgeFailsOnceAsIncompatible(t *testing.T) {
	t.Parallel()
	fake := bridgefake.New(t, bridgefake.Options{Legacy: true})
	cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: fake.URL(), Token: fake.Token(), HTTPClient: fake.Client(),
		WorkerVersion: "v0.0.0-this-worker"})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxCloudflare] = cf
		c.DefaultSandbox = protocol.SandboxCloudflare
	}})
	fleettest.WaitReady(t, w.W)
	for _, id := range []string{"cf-old-1", "cf-old-2"} {
		f.SubmitJSON("default", id, "hello old bridge")
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State)
		require.Equal(t, 1, r.Final.Attempt, "not retried")
		require.NotNil(t, r.Final.Error)
		require.Equal(t, protocol.CodeBridgeIncompatible, r.Final.Error.Code)
		require.Contains(t, r.Final.Error.Message, "unknown (before "+sandbox.BridgeVersion+")")
		require.Contains(t, r.Final.Error.Message, "v0.0.0-this-worker")
		for _, ev := range r.Statuses {
			require.NotEqual(t, protocol.StateRetrying, ev.State)
		}
	}
	require.Zero(t, fake.Creates(), "no sandbox made on a bridge the worker cannot use")
	require.Equal(t, 1, fake.VersionAsks(), "the worker asked the bridge once")
}
