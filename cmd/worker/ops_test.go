package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A worker is found through discovery and drained through it: it stops
// pulling, its running job keeps heartbeating past AckWait and finishes as
// attempt 1, and the process exits 0.
func TestWorkerDiscoveryAndDrain(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second})
	p := fleettest.StartCommand(t, workerArgs(t, "--nats-url", f.Srv.ClientURL(), "--inbox-prefix", "_INBOX", "--slots", "3", "--shutdown-grace", "2m")...)
	p.Expect(t, "pulling jobs")
	ctx, cancel := context.WithTimeout(context.Background(), fleettest.CommandWait)
	defer cancel()
	// Discovery gathers answers for a short window; on a loaded machine the
	// worker's first answer may miss it, so ask until it is found.
	var ws []protocol.WorkerInfo
	var err error
	fleettest.Eventually(t, fleettest.CommandWait, func() bool {
		ws, err = f.Client.Workers(ctx)
		return err == nil && len(ws) == 1
	}, "discovery finds the worker")
	require.Equal(t, protocol.WorkerPulling, ws[0].State)
	require.Equal(t, 3, ws[0].Slots)

	rep, err := f.Client.Submit(ctx, protocol.Job{ID: "drain-1", Prompt: "/standin lines=3 delay=2s"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	fleettest.Eventually(t, fleettest.CommandWait, func() bool {
		ws, err = f.Client.Workers(ctx)
		return err == nil && len(ws) == 1 && len(ws[0].Running) == 1
	}, "the worker reports the running job")
	require.Equal(t, "drain-1", ws[0].Running[0].ID)

	info, err := f.Client.Drain(ctx, ws[0].ID)
	require.NoError(t, err)
	require.Equal(t, protocol.WorkerDraining, info.State)
	require.Equal(t, 2*time.Minute, info.ShutdownGrace)
	r := f.Follow("default", "drain-1", fleettest.CommandWait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 1, r.Final.Attempt, "heartbeats kept the job through the drain (6s > AckWait 2s)")
	code, _, errOut := p.Wait(t)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `"why":"drain requested"`)
}

// --exit-if-idle: a worker with nothing to do exits 0 (scale to zero).
func TestWorkerExitIfIdle(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	p := fleettest.StartCommand(t, workerArgs(t, "--nats-url", f.Srv.ClientURL(), "--inbox-prefix", "_INBOX", "--exit-if-idle", "300ms")...)
	p.Expect(t, "no job for --exit-if-idle; exiting")
	code, _, errOut := p.Wait(t)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `"why":"idle (--exit-if-idle)"`)
}
