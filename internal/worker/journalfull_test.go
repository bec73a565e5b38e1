package worker_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// TestJournalDiskFull: while the journal's disk is full (its fault seam
// returns ENOSPC), a running job goes on and every one of its lines still
// reaches NATS; the worker says why it is not ready and starts no new job;
// once the disk has room it recovers by itself and runs the waiting job.
func TestJournalDiskFull(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	var full atomic.Bool
	startedWhileFull := make(chan bool, 4)
	w := f.StartWorker(fleettest.WorkerOpts{
		Slots: 2,
		JournalMod: func(c *journal.Config) {
			// The memory-first journal needs its disk only for lines the
			// stream has not acknowledged: make every log spill at its
			// first line, as when NATS is slow, so every line needs it.
			c.SpillBytes = 1
			c.SpaceProbeInterval = 10 * time.Millisecond
			c.Test.WriteFault = func(op string) error {
				if full.Load() {
					return syscall.ENOSPC
				}
				return nil
			}
		},
		Mod: func(c *worker.Config) {
			c.Test.RunStarted = func(_, id string, _ int) {
				if id == "after" {
					startedWhileFull <- full.Load()
				}
			}
		},
	})
	fleettest.WaitReady(t, w.W)

	lines := make(chan *nats.Msg, 1024)
	sub, err := f.NC.ChanSubscribe(f.Names.QueryMsg("default", "big"), lines)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	f.SubmitJSON("default", "big", "/standin lines=40 delay=25ms")
	recv(t, lines)
	full.Store(true) // the disk fills while the job runs

	fleettest.Eventually(t, wait, func() bool { return !w.W.Ready() }, "the worker reports the full journal")
	require.ErrorContains(t, w.W.NotReady(), "journal disk full")
	f.SubmitJSON("default", "after", "/standin")

	r := f.Follow("default", "big", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "the running job is not failed by the full disk")
	got := fleettest.RequireContiguous(t, r)
	require.Len(t, got, 43, "init, text, 40 lines and the result all reached NATS")
	// The lines the journal could not take are stored later, from the
	// stream (the archiver).
	want := fleettest.JoinLines(got)
	fleettest.Eventually(t, wait, func() bool {
		b, _ := f.Objects.Get(context.Background(), storage.TranscriptKey("default", "big"))
		return bytes.Equal(b, want)
	}, "the complete transcript of the job that ran while the disk was full")

	full.Store(false) // room again
	require.False(t, recv(t, startedWhileFull), "no job starts while the journal is full")
	r = f.Follow("default", "after", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.NoError(t, w.W.NotReady())
}
