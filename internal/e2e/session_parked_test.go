package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// A parked session ends by end or cancel (docs/sessions.md) like a live one, with one
// terminal status. Before, "end" alone resumed it as a continuation that ran
// no turn, and the worker crashed on the missing result (on every delivery,
// until the job was dead-lettered); a cancel was acknowledged but did
// nothing, and a later input resumed the session.
func TestParkedSessionEndsOnEndOrCancel(t *testing.T) {
	t.Parallel()
	one := 1
	park := func(t *testing.T, id string) (*fleettest.Fleet, *statusWatch) {
		f := fleettest.New(t, fleettest.Opts{})
		fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
		sw := watchStatus(t, f, "default", id)
		submitSession(t, f, "default", id, "before the park", &protocol.Session{IdleTimeoutS: &one}, protocol.Options{})
		sw.state(protocol.StateParked, 1)
		return f, sw
	}
	ended := func(t *testing.T, f *fleettest.Fleet, sw *statusWatch, id string) protocol.StatusEvent {
		final := sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
		r := f.Follow("default", id, wait)
		fleettest.RequireContiguous(t, r)
		require.Equal(t, final.State, r.Final.State)
		require.Equal(t, 1, terminalCount(f.History("default", id).Statuses), "one ending")
		return final
	}

	t.Run("end", func(t *testing.T) {
		t.Parallel()
		f, sw := park(t, "parked-end")
		sendCtl(t, f, "default", "parked-end", protocol.CtlOp{Op: protocol.OpEnd})
		final := ended(t, f, sw, "parked-end")
		require.Equal(t, protocol.StateSucceeded, final.State)
		require.Nil(t, final.Error)
		require.Equal(t, 1, final.Turn)
		require.NotEmpty(t, final.Result.SessionID)
	})
	t.Run("cancel on ctl", func(t *testing.T) {
		t.Parallel()
		f, sw := park(t, "parked-ctl")
		sendCtl(t, f, "default", "parked-ctl", protocol.CtlOp{Op: protocol.OpCancel})
		final := ended(t, f, sw, "parked-ctl")
		require.Equal(t, protocol.StateCancelled, final.State)
		require.Equal(t, protocol.CodeCancelled, final.Error.Code)
	})
	t.Run("cancel through the API", func(t *testing.T) {
		t.Parallel()
		f, sw := park(t, "parked-api")
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		rep, err := f.Client.Cancel(ctx, protocol.QueryRef{ID: "parked-api", Tenant: "default"})
		require.NoError(t, err)
		require.Nil(t, rep.Error)
		require.NotNil(t, rep.Status, "the reply says how the session ended")
		require.Equal(t, protocol.StateCancelled, rep.Status.State)
		require.Equal(t, protocol.StateCancelled, ended(t, f, sw, "parked-api").State)
		// The session is over: an input does not resume it.
		rep2, err := f.Client.SessionOp(ctx, protocol.OpInput, protocol.SessionOpRequest{ID: "parked-api", Tenant: "default", SessionOp: protocol.SessionOp{Text: "after the cancel"}})
		require.NoError(t, err)
		require.NotNil(t, rep2.Error)
	})
}

// options.timeout_s bounds each turn of a session: a turn that runs longer
// is stopped and the session ends failed, code timeout, with a synthetic
// result, as a one-shot run does. Before, sessions ignored it (found by
// QA: a session awaiting approval far past its timeout_s).
func TestSessionTurnTimeout(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "st-timeout")
	one := 1
	submitSession(t, f, "default", "st-timeout", "/standin sleep=1h", &protocol.Session{}, protocol.Options{TimeoutS: &one})
	final := sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, protocol.StateFailed, final.State)
	require.Equal(t, protocol.CodeTimeout, final.Error.Code)
	r := f.Follow("default", "st-timeout", wait)
	fleettest.RequireContiguous(t, r)
	res, err := protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).AsResult()
	require.NoError(t, err)
	require.Equal(t, protocol.ReasonTimeout, res.XFleet.Reason)
}
