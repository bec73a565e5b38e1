package e2e

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// An approval that cannot apply exits non-zero with the reason and sends
// nothing: a request id the agent never asked, and one already answered.
// Before, `dispatcher approve <session> <anything>` printed "approve sent".
func TestApprovingAnUnknownOrAnsweredRequestIsRefused(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	url := f.Srv.ClientURL()
	sw := watchStatus(t, f, "default", "appr-1")
	idle := 600
	submitSession(t, f, "default", "appr-1", "/standin ask=Bash", &protocol.Session{IdleTimeoutS: &idle, Approvals: protocol.ApprovalsRemote}, protocol.Options{})
	asked := sw.waitFor("awaiting_approval", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateAwaitingApproval && ev.RequestID != ""
	})

	code, _, errOut := runCLI(t, url, "", "approve", "appr-1", "req-nobody-asked")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "has no permission request req-nobody-asked")
	require.NotContains(t, errOut, "approve sent")

	code, _, errOut = runCLI(t, url, "", "approve", "appr-1", asked.RequestID)
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	sw.state(protocol.StateIdle, 1)

	code, _, errOut = runCLI(t, url, "", "approve", "appr-1", asked.RequestID, "--deny")
	require.Equal(t, fleetcli.ExitRejected, code, errOut)
	require.Contains(t, errOut, "was already answered")

	// Nothing but the one answer reached the agent: one permission line.
	sendCtl(t, f, "default", "appr-1", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "appr-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
}
