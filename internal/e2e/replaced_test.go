package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// An id submitted again while its earlier run is still going (past the
// dedupe window) replaces it: the new submission's claim fences the old
// run, and the old job is terminated at once. Before, the old job's
// message was left alone: never acked, it held a fleet slot until its ack
// wait ran out, was redelivered, refused at each claim, and was finally
// dead-lettered with a "max_deliveries" status although its query
// succeeded. With both runs on one worker, the new one also waits for the
// old one's journal log instead of being handed back as a spurious
// "retrying" attempt 2.
func TestResubmissionReplacesARunningSubmission(t *testing.T) {
	t.Parallel()
	t.Run("one worker", func(t *testing.T) {
		t.Parallel()
		f := fleettest.New(t, fleettest.Opts{DedupeWindow: time.Second, AckWait: 2 * time.Second, MaxDeliver: 3})
		fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
		replaceRunning(t, f)
	})
	t.Run("two workers", func(t *testing.T) {
		t.Parallel()
		f := fleettest.New(t, fleettest.Opts{DedupeWindow: time.Second, AckWait: 2 * time.Second, MaxDeliver: 3})
		fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
		fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
		replaceRunning(t, f)
	})
}

func replaceRunning(t *testing.T, f *fleettest.Fleet) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const id = "replaced-1"

	first, err := f.Client.Submit(ctx, protocol.Job{ID: id, Prompt: "/standin sleep=1h"})
	require.NoError(t, err)
	require.Nil(t, first.Error)
	fleettest.Eventually(t, wait, func() bool {
		for _, ev := range f.History("default", id).Statuses {
			if ev.State == protocol.StateRunning {
				return true
			}
		}
		return false
	}, "the first submission running")

	var second protocol.SubmitReply
	fleettest.Eventually(t, wait, func() bool {
		second, err = f.Client.Submit(ctx, protocol.Job{ID: id, Prompt: "/standin lines=2"})
		return err == nil && second.Error == nil && !second.Duplicate
	}, "the resubmission stored")

	// The old job leaves the work queue, and no run holds a slot.
	cons, err := f.JS.Consumer(ctx, f.Names.JobsStream(), f.Names.Consumer())
	require.NoError(t, err)
	jobs, err := f.JS.Stream(ctx, f.Names.JobsStream())
	require.NoError(t, err)
	var h fleettest.Run
	fleettest.Eventually(t, wait, func() bool {
		info, err := cons.Info(ctx)
		if err != nil || info.NumAckPending != 0 || info.NumPending != 0 {
			return false
		}
		si, err := jobs.Info(ctx, jetstream.WithSubjectFilter(f.Names.WorkWildcard()))
		if err != nil || len(si.State.Subjects) != 0 {
			return false
		}
		h = f.History("default", id)
		return terminalCount(h.Statuses) > 0
	}, "the old job gone and the new one ended")

	var terminal []protocol.StatusEvent
	for _, ev := range h.Statuses {
		require.NotEqual(t, protocol.StateRetrying, ev.State, "no spurious next attempt: %+v", ev)
		if ev.State.Terminal() {
			terminal = append(terminal, ev)
		}
	}
	require.Len(t, terminal, 1, "one ending: the new submission's")
	require.Equal(t, protocol.StateSucceeded, terminal[0].State)
	require.Equal(t, 1, terminal[0].Attempt)
	require.Greater(t, terminal[0].JobSeq, h.Statuses[0].JobSeq, "the ending is the newer submission's")

	// Nothing was dead-lettered.
	dlq, err := f.JS.Stream(ctx, f.Names.DLQStream())
	require.NoError(t, err)
	di, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, di.State.Msgs, "a replaced job is not dead-lettered")
}

// tail (and submit --follow) of an id submitted again after its earlier run
// ended follow the new run to its ending and exit with its code. Before,
// they stopped at the first terminal status they replayed, the earlier
// run's, and exited with that run's code.
func TestTailOfAResubmittedIDFollowsTheNewRun(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{DedupeWindow: time.Second})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const id = "tail-again"
	f.SubmitJSON("default", id, "/standin error=1")
	require.Equal(t, protocol.StateFailed, f.Follow("default", id, wait).Final.State)

	fleettest.Eventually(t, wait, func() bool {
		rep, err := f.Client.Submit(ctx, protocol.Job{ID: id, Prompt: "/standin say=second_run"})
		return err == nil && rep.Error == nil && !rep.Duplicate
	}, "the resubmission stored")
	code, out, errOut := runCLI(t, f.Srv.ClientURL(), "", "tail", id)
	require.Equal(t, fleetcli.ExitOK, code, "the new run's code: %s\n%s", out, errOut)
	require.Contains(t, out, "You asked: /standin say=second_run")
	final := f.Follow("default", id, wait).Final
	require.Equal(t, protocol.StateSucceeded, final.State)
}
