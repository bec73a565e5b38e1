package e2e

// A status is published only for a state the query was really in
// (docs/true-statuses.md). The histories are replayed from the query's
// .status subject in FLEET_QUERIES (fleettest.History), as a reader of the
// record sees them.

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// countState counts the statuses of state s in a replayed history.
func countState(r fleettest.Run, s protocol.State) int {
	n := 0
	for _, ev := range r.Statuses {
		if ev.State == s {
			n++
		}
	}
	return n
}

// statesOf lists a history's states, for failure messages.
func historyStates(r fleettest.Run) []protocol.State {
	out := make([]protocol.State, 0, len(r.Statuses))
	for _, ev := range r.Statuses {
		out = append(out, ev.State)
	}
	return out
}

// A job held behind a full fleet, cancelled while queued (its cancel on
// the .ctl subject, as any client can send it), then released when the
// fleet frees a slot: it ends "cancelled" and never "running". Before, the
// worker that took it published "running" with its claim and only then
// ended it, so the record said queued → running → cancelled.
func TestCancelledWhileHeldNeverRunning(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 1})
	log := watchStatuses(t, f.NC, f.Names)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	f.SubmitJSON("held", "busy", "/standin sleep=1h")
	log.waitFor(t, "busy running", func(ev protocol.StatusEvent) bool {
		return ev.ID == "busy" && ev.State == protocol.StateRunning
	})
	f.SubmitJSON("held", "waits", "/standin sleep=1h")
	log.waitFor(t, "waits held behind the full fleet", func(ev protocol.StatusEvent) bool {
		return ev.ID == "waits" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonFleetCap
	})
	sendCtl(t, f, "held", "waits", protocol.CtlOp{Op: protocol.OpCancel})
	// Release the fleet: the held job is admitted and taken by the worker.
	sendCtl(t, f, "held", "busy", protocol.CtlOp{Op: protocol.OpCancel})
	require.Equal(t, protocol.StateCancelled, f.Follow("held", "busy", wait).Final.State)

	r := f.Follow("held", "waits", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	h := f.History("held", "waits")
	fleettest.RequireOneTerminal(t, h)
	require.Zero(t, countState(h, protocol.StateRunning), "a job cancelled while queued never ran: %v", historyStates(h))
}

// A job held behind a full fleet and cancelled on its .ctl subject (as any
// client can send it) ends "cancelled" while the fleet is still full: the
// dispatcher's consumer of .ctl ops ends it as it reads the cancel. Before,
// nothing read that cancel until a slot freed and a worker was given the
// job, so the cancel waited on another run's end. A second job, cancelled
// through the API (whose cancel both the API and that consumer act on),
// gets one synthetic result, not one per dispatcher path.
func TestCancelOfAHeldJobEndsItWhileTheFleetIsFull(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 1})
	log := watchStatuses(t, f.NC, f.Names)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	f.SubmitJSON("held", "busy", "/standin sleep=1h")
	log.waitFor(t, "busy running", func(ev protocol.StatusEvent) bool {
		return ev.ID == "busy" && ev.State == protocol.StateRunning
	})
	for _, id := range []string{"by-ctl", "by-api"} {
		f.SubmitJSON("held", id, "/standin sleep=1h")
		log.waitFor(t, id+" held behind the full fleet", func(ev protocol.StatusEvent) bool {
			return ev.ID == id && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonFleetCap
		})
	}
	sendCtl(t, f, "held", "by-ctl", protocol.CtlOp{Op: protocol.OpCancel})
	rep, err := f.Client.Cancel(context.Background(), protocol.QueryRef{Tenant: "held", ID: "by-api"})
	require.NoError(t, err)
	require.True(t, rep.OK)
	for _, id := range []string{"by-ctl", "by-api"} {
		r := f.Follow("held", id, wait)
		require.Equal(t, protocol.StateCancelled, r.Final.State, id)
		require.Len(t, r.Lines, 1, "%s: one synthetic result: the agent never started", id)
		h := f.History("held", id)
		fleettest.RequireOneTerminal(t, h)
		require.Zero(t, countState(h, protocol.StateRunning), "%s never ran: %v", id, historyStates(h))
	}
	// The fleet was full all along: the cancels did not wait for its slot.
	busy := f.History("held", "busy")
	require.Equal(t, protocol.StateRunning, busy.Statuses[len(busy.Statuses)-1].State, "busy still holds the fleet's one slot")
	sendCtl(t, f, "held", "busy", protocol.CtlOp{Op: protocol.OpCancel})
	require.Equal(t, protocol.StateCancelled, f.Follow("held", "busy", wait).Final.State)
}

// A two-turn session announces each turn's start once: exactly one
// "running" before each of its two "idle"s. Before, the first turn had
// two: the claim's and the turn's.
func TestSessionOneRunningPerTurn(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "turns")
	submitSession(t, f, "default", "turns", "first prompt", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "turns", input("second input"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "turns", protocol.CtlOp{Op: protocol.OpEnd})
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "turns", wait).Final.State)

	h := f.History("default", "turns")
	var perTurn []int // "running"s before each "idle", and before the end
	n := 0
	for _, ev := range h.Statuses {
		switch {
		case ev.State == protocol.StateRunning:
			n++
		case ev.State == protocol.StateIdle || ev.State.Terminal():
			perTurn = append(perTurn, n)
			n = 0
		}
	}
	require.Equal(t, []int{1, 1, 0}, perTurn, "one running per turn start: %v", historyStates(h))
}

// Every status a worker publishes for a session job says "session":true,
// and no status of a one-shot query does: a reader of the last status
// (the dispatcher refusing input to a one-shot query) can tell them apart
// whatever the state.
func TestSessionStatusesAreMarked(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	sw := watchStatus(t, f, "default", "marked")
	submitSession(t, f, "default", "marked", "first prompt", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "marked", protocol.CtlOp{Op: protocol.OpEnd})
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "marked", wait).Final.State)
	f.SubmitJSON("default", "plain", "one shot")
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "plain", wait).Final.State)

	h := f.History("default", "marked")
	byWorker := 0
	for _, ev := range h.Statuses {
		if ev.Worker != "" {
			byWorker++
			require.True(t, ev.Session, "a session's %s status is marked", ev.State)
		}
	}
	require.GreaterOrEqual(t, byWorker, 3, "running, idle and succeeded: %v", historyStates(h))
	h = f.History("default", "plain")
	require.NotEmpty(t, h.Statuses)
	for _, ev := range h.Statuses {
		require.False(t, ev.Session, "a one-shot query's %s status is not marked", ev.State)
	}
}

// `send` to a running one-shot query exits non-zero with the reason and
// stores nothing on its .ctl subject; a session still takes it. Before,
// it printed "input sent", exited 0, and the input went nowhere.
func TestCLISendToAOneShotQueryIsRefused(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	url := f.Srv.ClientURL()
	sw := watchStatus(t, f, "default", "oneshot")
	f.SubmitJSON("default", "oneshot", "/standin sleep=1h")
	sw.waitFor("running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })

	for _, args := range [][]string{{"send", "oneshot", "more"}, {"send", "oneshot", "--end"}, {"approve", "oneshot", "req_1"}} {
		code, _, errOut := runCLI(t, url, "", args...)
		require.Equal(t, fleetcli.ExitUsage, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "default/oneshot is not a session", args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	_, err = st.GetLastMsgForSubject(ctx, f.Names.QueryCtl("default", "oneshot"))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing was sent to the one-shot query")

	// A session takes input while its first turn runs.
	ss := watchStatus(t, f, "default", "sess")
	submitSession(t, f, "default", "sess", "/standin sleep=2s", &protocol.Session{}, protocol.Options{})
	ss.waitFor("running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
	code, _, errOut := runCLI(t, url, "", "send", "sess", "--end")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "sess", wait).Final.State)

	sendCtl(t, f, "default", "oneshot", protocol.CtlOp{Op: protocol.OpCancel})
	require.Equal(t, protocol.StateCancelled, f.Follow("default", "oneshot", wait).Final.State)
}

// Inputs sent while a turn runs queue behind it: each of the turns that
// follow, back to back with no idle between, is announced by a "running"
// of its own: as many "running"s as turns.
func TestSessionQueuedTurnsEachAnnounced(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "queued-turns")
	submitSession(t, f, "default", "queued-turns", "/standin sleep=3s", &protocol.Session{}, protocol.Options{})
	sw.waitFor("running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
	sendCtl(t, f, "default", "queued-turns", input("second"))
	sendCtl(t, f, "default", "queued-turns", input("third"))
	sw.state(protocol.StateIdle, 3)
	sendCtl(t, f, "default", "queued-turns", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "queued-turns", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 3, r.Final.Turn)
	h := f.History("default", "queued-turns")
	require.Equal(t, 3, countState(h, protocol.StateRunning), "one running per turn: %v", historyStates(h))
}
