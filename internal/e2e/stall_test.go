package e2e

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// stallChecks counts, per query, the stall watch's checks that found the
// turn silent for its timeout, and those that declared a stall.
type stallChecks struct {
	mu      sync.Mutex
	reached map[string]int
	stalled map[string]int
	ch      chan struct{}
}

func newStallChecks() *stallChecks {
	return &stallChecks{reached: map[string]int{}, stalled: map[string]int{}, ch: make(chan struct{}, 1)}
}

func (c *stallChecks) hook(_, id string, stalled bool) {
	c.mu.Lock()
	c.reached[id]++
	if stalled {
		c.stalled[id]++
	}
	c.mu.Unlock()
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

// waitReached waits until id's watch found it silent n times.
func (c *stallChecks) waitReached(t *testing.T, id string, n int) {
	t.Helper()
	deadline := time.After(wait)
	for {
		c.mu.Lock()
		got := c.reached[id]
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %d silent checks of %s (got %d)", n, id, got)
		}
	}
}

func (c *stallChecks) stalls(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stalled[id]
}

// stallWorker starts a worker whose stall timeout is d (grace: grace),
// with a metrics registry and the checks' hook.
func stallWorker(t *testing.T, f *fleettest.Fleet, d, grace time.Duration) (*stallChecks, *worker.Metrics) {
	t.Helper()
	c := newStallChecks()
	m := worker.NewMetrics(prometheus.NewRegistry(), 2, nil)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2, Mod: func(cfg *worker.Config) {
		cfg.StallTimeout, cfg.StallGrace, cfg.StallTimeoutMax = d, grace, time.Hour
		cfg.Metrics = m
		cfg.Test.StallChecked = c.hook
	}}).W)
	return c, m
}

func submitOpts(t *testing.T, f *fleettest.Fleet, id, prompt string, opts protocol.Options) {
	t.Helper()
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt, Options: opts})
	require.NoError(t, err)
	f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: "default." + id})
}

// TestStandinOneShotStallFails: an agent that goes silent mid-turn (and
// one whose tool call's child sleeps) is stopped after its stall timeout
// and the run fails with code stalled, saying how long it was silent;
// the stalls are counted for the tenant.
func TestStandinOneShotStallFails(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	_, m := stallWorker(t, f, time.Hour, time.Second)
	// The job's stall_timeout replaces the worker's hour.
	submitOpts(t, f, "silent-1", "/standin silent=1", protocol.Options{StallTimeout: "300ms"})
	submitOpts(t, f, "sleeper-1", "/standin tool=sleep", protocol.Options{StallTimeout: "300ms"})
	for _, id := range []string{"silent-1", "sleeper-1"} {
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State, id)
		require.Equal(t, protocol.CodeStalled, r.Final.Error.Code, id)
		require.Contains(t, r.Final.Error.Message, "seconds while its turn ran (stalled)", id)
		res := results(r)
		require.Len(t, res, 1)
		require.Equal(t, protocol.ReasonStalled, res[0]["x_fleet"].(map[string]any)["reason"])
	}
	require.InDelta(t, 2, testutil.ToFloat64(m.Stalls().WithLabelValues("default")), 0)
}

// TestStandinBusyToolIsNoStall: a tool call whose child keeps the CPU
// busy, writing nothing for several stall timeouts, is activity: the run
// goes on to its result.
func TestStandinBusyToolIsNoStall(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	c, _ := stallWorker(t, f, 400*time.Millisecond, time.Second)
	submitOpts(t, f, "busy-1", "/standin tool=busy toolfor=3s", protocol.Options{})
	r := f.Follow("default", "busy-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Zero(t, c.stalls("busy-1"))
	c.waitReached(t, "busy-1", 2) // the watch did look, and let it run
}

// TestStandinInvalidStallTimeoutRefused: a stall_timeout above the
// worker's maximum fails the job, naming the field.
func TestStandinInvalidStallTimeoutRefused(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	stallWorker(t, f, time.Minute, time.Second)
	submitOpts(t, f, "toolong-1", "hi", protocol.Options{StallTimeout: "2h"})
	r := f.Follow("default", "toolong-1", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeInvalidJob, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "options.stall_timeout")
	require.Contains(t, r.Final.Error.Message, "maximum")
}

// TestStandinSessionApprovalWaitIsNoStall: a turn waiting for an approval
// is silent for many stall timeouts without a stall; answered, it ends.
func TestStandinSessionApprovalWaitIsNoStall(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	c, _ := stallWorker(t, f, 300*time.Millisecond, time.Second)
	sw := watchStatus(t, f, "default", "ask-1")
	idle := 600
	submitSession(t, f, "default", "ask-1", "/standin ask=Bash",
		&protocol.Session{IdleTimeoutS: &idle, Approvals: protocol.ApprovalsRemote}, protocol.Options{})
	req := sw.waitFor("awaiting approval", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateAwaitingApproval && ev.RequestID != ""
	})
	c.waitReached(t, "ask-1", 3)
	require.Zero(t, c.stalls("ask-1"))
	allow := true
	sendCtl(t, f, "default", "ask-1", protocol.CtlOp{Op: protocol.OpApprove, SessionOp: protocol.SessionOp{RequestID: req.RequestID, Allow: &allow}})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "ask-1", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "ask-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Zero(t, c.stalls("ask-1"))
	for _, ev := range sw.all() {
		require.NotEqual(t, protocol.ReasonStalled, ev.Reason)
	}
}

// TestStandinSessionStallInterruptedThenResumed: a stalled session turn is
// interrupted (a status says so); an agent that answers ends the turn and
// goes on; one deaf to the interrupt is stopped after the grace and the
// session resumes from its checkpoint on the next input, with the
// stalled input not applied again.
func TestStandinSessionStallInterruptedThenResumed(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	c, m := stallWorker(t, f, 300*time.Millisecond, 500*time.Millisecond)
	sw := watchStatus(t, f, "default", "stall-s")
	idle := 600
	submitSession(t, f, "default", "stall-s", "first", &protocol.Session{IdleTimeoutS: &idle}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)

	// Silent, but it answers the interrupt.
	sendCtl(t, f, "default", "stall-s", input("/standin silent=1"))
	ev := sw.waitFor("the stall", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateRunning && ev.Reason == protocol.ReasonStalled
	})
	require.Equal(t, protocol.CodeStalled, ev.Error.Code)
	require.Contains(t, ev.Error.Message, "the turn is interrupted")
	sw.state(protocol.StateIdle, 2)

	// Deaf to the interrupt: stopped, the session resumed.
	sendCtl(t, f, "default", "stall-s", input("/standin silent=deaf"))
	ev = sw.waitFor("the resume", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateIdle && ev.Reason == protocol.ReasonStalled
	})
	require.Equal(t, protocol.CodeStalled, ev.Error.Code)
	require.Contains(t, ev.Error.Message, "resumed from its last checkpoint")
	sendCtl(t, f, "default", "stall-s", input("after the stall"))
	sw.state(protocol.StateIdle, 4)
	sendCtl(t, f, "default", "stall-s", protocol.CtlOp{Op: protocol.OpEnd})

	r := f.Follow("default", "stall-s", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	res := results(r)
	require.Len(t, res, 4)
	require.Equal(t, "error_during_execution", res[1]["subtype"], "the interrupted turn's own result")
	require.Equal(t, protocol.ReasonStalled, res[2]["x_fleet"].(map[string]any)["reason"], "the stopped turn's synthetic result")
	// The resumed agent's history: the stalled input is not in it again.
	require.Equal(t, []string{
		`[stand-in agent] You said: first (0 earlier messages in this session)`,
		`[stand-in agent] You said: after the stall (2 earlier messages in this session)`,
	}, answers(r))
	require.Equal(t, 2, c.stalls("stall-s"))
	require.InDelta(t, 2, testutil.ToFloat64(m.Stalls().WithLabelValues("default")), 0)
}
