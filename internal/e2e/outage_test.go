package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A NATS outage longer than AckWait, with jobs running and lines piling up
// in the workers' journals. The server comes back on the same store; the
// two workers that ran the jobs stay cut off a while longer (their dials
// wait on a gate) until a third worker has taken every job over as attempt
// 2. Then they reconnect with a journaled backlog to relay and a terminal
// status to publish, the race between them made certain: each query must
// still end with exactly one terminal status, unique and contiguous
// Fleet-Seq, and a transcript equal to the stream.
func TestNATSOutageLongerThanAckWait(t *testing.T) {
	t.Parallel()
	const ackWait = 2 * time.Second
	g := newGate()
	var gated atomic.Bool
	srv := natstest.RunServer(t)
	f := fleettest.New(t, fleettest.Opts{AckWait: ackWait, Server: srv, Connect: func(t testing.TB, role string) *nats.Conn {
		var opts []nats.Option
		if role == "worker" && gated.Load() {
			opts = append(opts, nats.SetCustomDialer(g))
		}
		nc, _ := natstest.Connect(t, srv, opts...)
		return nc
	}})
	ended := make(chan string, 64)
	hooks := func(c *worker.Config) {
		c.Test.RunEnded = func(_, id string, attempt int) {
			if attempt == 1 {
				ended <- id
			}
		}
	}
	gated.Store(true)
	workers := []*fleettest.Worker{
		f.StartWorker(fleettest.WorkerOpts{Slots: 3, Mod: hooks}),
		f.StartWorker(fleettest.WorkerOpts{Slots: 3, Mod: hooks}),
	}
	gated.Store(false)
	for _, w := range workers {
		fleettest.WaitReady(t, w.W)
	}
	ids := []string{"out-1", "out-2", "out-3", "out-4", "out-5", "out-6"}
	for _, id := range ids {
		f.SubmitJSON("default", id, "/standin lines=150 delay=10ms")
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, id := range ids {
		waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", id), 5)
	}

	// The outage: the server goes away while every agent is still writing.
	g.hold()
	f.Srv.Shutdown()
	// Every first attempt's agent exits during the outage, so each run
	// holds a journaled backlog and a terminal status it cannot send.
	for range ids {
		select {
		case <-ended:
		case <-ctx.Done():
			t.Fatal("agents did not finish during the outage")
		}
	}
	srv = natstest.Restart(t, srv)
	f.Srv = srv
	f.StopFirstOnCleanup(workers...)
	// The first workers are still away: past AckWait every job goes to
	// the new worker, whose claim comes first.
	workers = append(workers, f.StartWorker(fleettest.WorkerOpts{Slots: len(ids)}))
	for _, id := range ids {
		fleettest.Eventually(t, wait, func() bool {
			for _, ev := range f.History("default", id).Statuses {
				if ev.Attempt > 1 {
					return true
				}
			}
			return false
		}, id+" taken over by a later attempt")
	}
	g.release() // the first workers come back with their backlogs

	for _, id := range ids {
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State, id)
	}
	// Let every attempt (the fenced ones included) end before reading the
	// histories, so a late second terminal status would be seen.
	for _, w := range workers {
		require.NoError(t, w.W.Stop(ctx))
	}
	for _, id := range ids {
		h := f.History("default", id)
		fleettest.RequireOneTerminal(t, h)
		require.Greater(t, h.Final.Attempt, 1, "%s: the later attempt ended the query", id)
		lines := fleettest.RequireContiguous(t, h)
		for _, w := range workers {
			require.NoError(t, w.Journal.WaitPersisted(ctx, "default", id))
		}
		require.Equal(t, string(fleettest.JoinLines(lines)), string(f.Transcript(f.Objects, "default", id)),
			"%s: the stored transcript equals the stream", id)
	}
}

// gate is a NATS dialer that can hold connections off: while held, a dial
// waits until release (or, refusing, fails at once: NATS unreachable).
type gate struct {
	mu     sync.Mutex
	open   chan struct{}
	refuse bool
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) hold() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) release() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gate) Dial(network, address string) (net.Conn, error) {
	g.mu.Lock()
	open, refuse := g.open, g.refuse
	g.mu.Unlock()
	if refuse {
		select {
		case <-open:
		default:
			return nil, errors.New("connection refused (gate held)")
		}
	}
	select {
	case <-open:
	case <-time.After(wait):
		return nil, errors.New("gate held too long")
	}
	return net.Dial(network, address)
}

// A worker started while NATS is unreachable learns the server's max
// payload when it first connects: ordinary lines go out as themselves and
// only a line too large for the server becomes a pointer to the whole line
// in storage (a worker that read the max payload as 0 before connecting
// would make every line a pointer to an object never stored).
func TestWorkerStartedBeforeItsServerRelaysRealLines(t *testing.T) {
	t.Parallel()
	g := newGate()
	g.refuse = true
	var gated atomic.Bool
	srv := natstest.RunServer(t, natstest.WithMaxPayload(64<<10))
	f := fleettest.New(t, fleettest.Opts{Server: srv, Connect: func(t testing.TB, role string) *nats.Conn {
		var opts []nats.Option
		if gated.Load() {
			opts = append(opts, nats.SetCustomDialer(g), nats.RetryOnFailedConnect(true))
		}
		nc, _ := natstest.Connect(t, srv, opts...)
		return nc
	}})
	g.hold()
	gated.Store(true)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	gated.Store(false)
	require.False(t, w.NC.IsConnected(), "the worker started while NATS was unreachable")
	g.release()
	fleettest.WaitReady(t, w.W)

	f.SubmitJSON("default", "mp-1", "/standin lines=3 big=100000")
	r := f.Follow("default", "mp-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	lines := fleettest.RequireContiguous(t, r)
	var pointers [][]byte
	for _, l := range lines {
		if protocol.ParseMessage(l).Type == "x_fleet_large_line" {
			pointers = append(pointers, l)
		}
	}
	require.Len(t, pointers, 1, "only the 100 kB line is too large for a 64 KiB server; %d of %d lines were pointers", len(pointers), len(lines))
	var ptr struct {
		Bytes int    `json:"bytes"`
		Key   string `json:"key"`
	}
	require.NoError(t, json.Unmarshal(pointers[0], &ptr))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, w.Journal.WaitPersisted(ctx, "default", "mp-1"))
	whole, err := f.Objects.Get(ctx, ptr.Key)
	require.NoError(t, err, "the pointer's line is stored whole")
	require.Len(t, whole, ptr.Bytes)
}

// TestGroupedLinesSurviveAServerRestart: an agent writes lines as fast as
// it can, so its lines queue up and go out in groups (one acknowledgement
// and one count per group: worker.relay.sendGroup); the server restarts
// on its store in the middle of the run, with groups in flight. The run
// succeeds, the stream holds every Fleet-Seq once, the transcript is the
// agent's lines in order, and groups were used.
func TestGroupedLinesSurviveAServerRestart(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	f := fleettest.New(t, fleettest.Opts{Server: srv})
	reg := prometheus.NewRegistry()
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) { c.Metrics = worker.NewMetrics(reg, 1, nil) }})
	fleettest.WaitReady(t, w.W)
	const lines = 10000
	f.SubmitJSON("default", "fast-1", "/standin lines="+strconv.Itoa(lines))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", "fast-1"), 1000)
	f.Srv = natstest.Restart(t, srv)
	f.StopFirstOnCleanup(w)

	r := f.Follow("default", "fast-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	bySeq := map[uint64][]byte{}
	for _, l := range r.Lines {
		if _, dup := bySeq[l.Seq]; dup {
			t.Fatalf("Fleet-Seq %d stored twice", l.Seq)
		}
		bySeq[l.Seq] = l.Data
	}
	want := make([][]byte, len(bySeq))
	for seq, data := range bySeq {
		require.LessOrEqual(t, seq, uint64(len(bySeq)), "Fleet-Seq contiguous from 1")
		want[seq-1] = data
	}
	require.Greater(t, len(want), lines, "every assistant line and the result")
	require.True(t, protocol.ParseMessage(want[len(want)-1]).IsResult())
	require.Equal(t, string(fleettest.JoinLines(want)), string(f.Transcript(f.Objects, "default", "fast-1")))
	require.Positive(t, groupCount(t, reg, "stored"), "lines went out in groups")
	t.Logf("groups stored %v, resent %v", groupCount(t, reg, "stored"), groupCount(t, reg, "resent"))
}

func groupCount(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "fleet_worker_line_groups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
