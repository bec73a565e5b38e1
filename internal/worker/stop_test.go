package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The agent of these tests writes result/success when it gets SIGTERM, as
// Claude Code does when a stop ends its running tool. The worker's
// decision to stop the run must stay the outcome.

// TestTimeoutStaysTimeoutWhenTheAgentAnswersSIGTERMWithSuccess: a run
// stopped by its timeout ends failed (timeout), with the agent's late
// result still in the stream, unchanged, before the synthetic one.
func TestTimeoutStaysTimeoutWhenTheAgentAnswersSIGTERMWithSuccess(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	one := 1
	body, err := json.Marshal(protocol.Job{ID: "late1", Prompt: "/standin termresult=1 sleep=1h", Options: protocol.Options{TimeoutS: &one}})
	require.NoError(t, err)
	f.PublishJob("default", body, nil)
	r := f.Follow("default", "late1", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeTimeout, r.Final.Error.Code)
	lines := fleettest.RequireContiguous(t, r)
	require.GreaterOrEqual(t, len(lines), 2)
	late := protocol.ParseMessage(lines[len(lines)-2])
	require.True(t, late.IsResult(), "the agent's own late result is relayed")
	res, err := late.AsResult()
	require.NoError(t, err)
	require.False(t, res.IsError)
}

// TestHandbackIsContinuedWhenTheAgentAnswersSIGTERMWithSuccess: a worker
// shutting down hands its run back; the agent's success written on SIGTERM
// must not end the query: the next attempt continues and ends it.
func TestHandbackIsContinuedWhenTheAgentAnswersSIGTERMWithSuccess(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan int, 4)
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Grace: time.Millisecond, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, _ string, attempt int) { started <- attempt }
	}})
	// The agent's first line says it is running (its SIGTERM handler set).
	first := make(chan *nats.Msg, 64)
	sub, err := f.NC.ChanSubscribe(f.Names.QueryMsg("default", "late2"), first)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	f.SubmitJSON("default", "late2", "/standin termresult=1 lines=30 delay=100ms")
	require.Equal(t, 1, recv(t, started))
	recv(t, first)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, a.W.Stop(ctx))

	f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	r := f.Follow("default", "late2", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Attempt, "the handed-back query was continued by attempt 2")
	for _, ev := range r.Statuses {
		require.False(t, ev.State.Terminal() && ev.Attempt == 1, "attempt 1 must not end the query (%s)", ev.State)
	}
	fleettest.RequireContiguous(t, r)
}
