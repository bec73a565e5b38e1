package worker_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestFastAgentIsPacedNotSpilled: an agent that writes faster than the
// stream stores is slowed to the stream's pace (QueueBytes counts the lines
// queued and in flight) instead of making the memory-first journal spill
// to disk. Before, only the queue was bounded: 256 lines in flight of 4 KiB
// alone passed SpillBytes, and the journal wrote its WAL on the happy path.
func TestFastAgentIsPacedNotSpilled(t *testing.T) {
	const lines = 3000
	var walWrites atomic.Int64
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1,
		Mod: func(c *worker.Config) { c.QueueBytes = 128 << 10 },
		JournalMod: func(c *journal.Config) {
			c.SpillBytes = 256 << 10
			c.SpillAfter = time.Hour // only the byte bound can spill here
			c.Test.WriteFault = func(op string) error {
				if op == "wal" {
					walWrites.Add(1)
				}
				return nil
			}
		}})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "fast", fmt.Sprintf("/standin lines=%d size=4096", lines))
	r := f.Follow("default", "fast", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	h := f.History("default", "fast")
	require.Len(t, fleettest.RequireContiguous(t, h), lines+3, "every line is in the stream")
	require.Zero(t, walWrites.Load(), "the journal wrote lines to disk on the happy path")
}
