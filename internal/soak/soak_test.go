// Package soak is a bounded chaos run of the whole fleet on an embedded
// JetStream server: many jobs, worker processes SIGKILLed and restarted at
// random, one NATS restart that lasts longer than the ack wait, and a full
// journal disk on one worker. Then, for every job: exactly one terminal
// status, contiguous Fleet-Seq ending with a result, a stored transcript
// equal to the lines the agent wrote, and no two attempts appending at
// once. It prints the counts.
//
// `make soak` runs 1,000 jobs (SOAK_JOBS=1000); `make soak/short` 40.
package soak

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

func TestSoak(t *testing.T) {
	// `make test` runs a short soak; `make soak` sets SOAK_JOBS.
	jobs := 24
	if v := os.Getenv("SOAK_JOBS"); v != "" {
		var err error
		jobs, err = strconv.Atoi(v)
		require.NoError(t, err)
	} else if testing.Short() {
		t.Skip("-short: the soak runs in `make test`, `make soak` and `make soak/short`")
	}
	const (
		ackWait = 2 * time.Second
		procs   = 3
	)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	f := fleettest.New(t, fleettest.Opts{AckWait: ackWait, MaxDeliver: 50})
	root := f.Objects.(*storage.FS).Root()

	// Worker processes (so they can be SIGKILLed), each with a journal dir
	// it keeps across restarts, and one in-process worker whose journal
	// disk fills for a while (its fault seam).
	jdirs := make([]string, procs)
	workers := make([]*fleettest.WorkerProc, procs)
	for i := range procs {
		jdirs[i] = filepath.Join(t.TempDir(), "journal")
		workers[i] = fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), jdirs[i], root)
	}
	var full atomic.Bool
	f.StartWorker(fleettest.WorkerOpts{Slots: 2, JournalMod: func(c *journal.Config) {
		// Every log of this worker spills at its first line (as when NATS
		// is slow), so the full disk meets every line it runs.
		c.SpillBytes = 1
		c.SpaceProbeInterval = 20 * time.Millisecond
		c.Test.WriteFault = func(string) error {
			if full.Load() {
				return syscall.ENOSPC
			}
			return nil
		}
	}})

	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = "soak" + strconv.Itoa(i)
		prompt := fmt.Sprintf("/standin lines=%d delay=%dms", 5+rng.IntN(40), 1+rng.IntN(8))
		f.SubmitJSON("default", ids[i], prompt)
	}

	// Chaos, driven by progress: kills all along, the NATS restart at a
	// third, the full disk at two thirds.
	var finished atomic.Int64
	var kills, natsRestarts, fullDisks int
	chaosDone := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(chaosDone)
		killEvery := max(jobs/10, 4)
		nextKill, restarted, filled := int64(killEvery), false, false
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			n := finished.Load()
			switch {
			case n >= nextKill:
				i := rng.IntN(procs)
				workers[i].Kill(t)
				kills++
				workers[i] = fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), jdirs[i], root)
				nextKill += int64(killEvery)
			case !restarted && n >= int64(jobs/3):
				restarted = true
				f.Srv.Shutdown()
				time.Sleep(ackWait + time.Second) // the outage outlasts the ack wait
				f.Srv = natstest.Restart(t, f.Srv)
				natsRestarts++
			case !filled && n >= int64(2*jobs/3):
				filled = true
				full.Store(true)
				time.Sleep(time.Second)
				full.Store(false)
				fullDisks++
			}
		}
	}()

	// Wait for every job's terminal status (the dispatcher's index).
	left := map[string]bool{}
	for _, id := range ids {
		left[id] = true
	}
	deadline := time.Now().Add(time.Duration(jobs)*time.Second + 3*time.Minute)
	for len(left) > 0 {
		require.True(t, time.Now().Before(deadline), "%d jobs never finished", len(left))
		for id := range left {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err := storage.GetStatus(ctx, f.Objects, "default", id)
			cancel()
			if err == nil && st.State.Terminal() {
				delete(left, id)
				finished.Add(1)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	<-chaosDone

	// Verify every job.
	var (
		mu                         sync.Mutex
		states                     = map[protocol.State]int{}
		lines, retried, maxAttempt int
	)
	for _, id := range ids {
		r := f.History("default", id)
		fleettest.RequireOneTerminal(t, r)
		got := fleettest.RequireContiguous(t, r)
		// No two attempts at once: in stream order, an attempt never
		// appends after a later one did.
		hi := 0
		for _, l := range r.Lines {
			require.GreaterOrEqual(t, l.Attempt, hi, "%s: attempt %d appended after attempt %d", id, l.Attempt, hi)
			hi = l.Attempt
		}
		want := fleettest.JoinLines(got)
		var b []byte
		for end := time.Now().Add(time.Minute); ; {
			b, _ = f.Objects.Get(context.Background(), storage.TranscriptKey("default", id))
			if bytes.Equal(b, want) {
				break
			}
			if time.Now().After(end) {
				tl := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
				first := -1
				for i := range min(len(tl), len(got)) {
					if !bytes.Equal(tl[i], got[i]) {
						first = i
						break
					}
				}
				t.Fatalf("%s: transcript has %d lines, the stream %d (first difference at line %d; attempts in the stream: %v)",
					id, len(tl), len(got), first, attemptsOf(r))
			}
			time.Sleep(100 * time.Millisecond)
		}
		mu.Lock()
		states[r.Final.State]++
		lines += len(got)
		if r.Final.Attempt > 1 {
			retried++
		}
		maxAttempt = max(maxAttempt, r.Final.Attempt)
		mu.Unlock()
	}
	archived, merged := f.Arch.Archived(), f.Arch.Merged()
	// Stop the fleet's services now, while the server they use still runs
	// (the restarted server's cleanup would otherwise come first).
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	require.NoError(t, f.Arch.Stop(sctx))
	require.NoError(t, f.Disp.Stop(sctx))
	scancel()

	summary := fmt.Sprintf("soak: jobs=%d succeeded=%d failed=%d cancelled=%d lines=%d worker_kills=%d nats_restarts=%d full_disks=%d jobs_retried=%d max_attempt=%d transcripts_archived=%d merged_with_journal_chunks=%d",
		jobs, states[protocol.StateSucceeded], states[protocol.StateFailed], states[protocol.StateCancelled], lines,
		kills, natsRestarts, fullDisks, retried, maxAttempt, archived, merged)
	t.Log(summary)
	fmt.Println(summary)
	require.Equal(t, jobs, states[protocol.StateSucceeded], "every job succeeds in the end")
}

func attemptsOf(r fleettest.Run) map[int]int {
	out := map[int]int{}
	for _, l := range r.Lines {
		out[l.Attempt]++
	}
	return out
}
