package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
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
	// Each line once: the agent's permission request is on .msg once,
	// whatever the approvals (one applied, two refused) did.
	requests := 0
	for _, l := range fleettest.RequireContiguous(t, r) {
		var m struct {
			Type      string `json:"type"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal(l, &m) == nil && m.Type == "control_request" && m.RequestID == asked.RequestID {
			requests++
		}
	}
	require.Equal(t, 1, requests, "the permission request %s is on .msg once", asked.RequestID)
}

// The API refuses a session op on a one-shot query, whoever asks (the CLI
// refuses it too, before asking): while it is queued (decided from the job
// itself) and while it runs (its statuses carry no session mark), with
// nothing stored on its .ctl subject.
func TestSessionOpsOnAOneShotQueryAreRefusedByTheAPI(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	send := func(op string) *protocol.ErrorInfo {
		r, err := f.Client.SessionOp(ctx, op, protocol.SessionOpRequest{ID: "one-shot", SessionOp: protocol.SessionOp{Text: "more"}})
		require.NoError(t, err)
		return r.Error
	}
	sub, err := f.Client.Submit(ctx, protocol.Job{ID: "one-shot", Prompt: "/standin sleep=1h"})
	require.NoError(t, err)
	require.Nil(t, sub.Error)
	e := send(protocol.OpInput) // queued: no worker yet
	require.NotNil(t, e)
	require.Equal(t, "not_a_session", e.Code)

	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	fleettest.Eventually(t, wait, func() bool {
		rep, err := f.Client.Status(ctx, protocol.QueryRef{ID: "one-shot"})
		return err == nil && rep.Status != nil && rep.Status.State == protocol.StateRunning
	}, "one-shot running")
	for _, op := range []string{protocol.OpInput, protocol.OpEnd} {
		e := send(op)
		require.NotNil(t, e, op)
		require.Equal(t, "not_a_session", e.Code, op)
	}
	stream, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	_, err = stream.GetLastMsgForSubject(ctx, f.Names.QueryCtl("default", "one-shot"))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing was sent")
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "one-shot"), []byte(`{"op":"cancel"}`)))
}

// An approval of a request whose awaiting_approval status is not stored
// yet is accepted once the status arrives: the agent's control_request
// line on .msg can reach a client first (a request queued behind another
// is announced when the one before is answered, and `dispatcher attach`
// prompts for it at once), and that client is not wrong. The status here
// is published by hand, after the dispatcher began reading the query's
// history, so the check must wait for it.
func TestAnApprovalSentBeforeItsStatusIsAccepted(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	status := func(ev protocol.StatusEvent) {
		ev.V, ev.Tenant, ev.ID, ev.At, ev.Session, ev.Worker = 1, "default", "late-1", time.Now(), true, "w-by-hand"
		data, err := json.Marshal(ev)
		require.NoError(t, err)
		_, err = f.JS.Publish(ctx, f.Names.QueryStatus("default", "late-1"), data)
		require.NoError(t, err)
	}
	status(protocol.StatusEvent{State: protocol.StateIdle, Attempt: 1})
	stream, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	consumers := func() int {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}
	before := consumers()

	allow := true
	reply := make(chan protocol.APIReply, 1)
	go func() {
		r, err := f.Client.SessionOp(ctx, protocol.OpApprove, protocol.SessionOpRequest{ID: "late-1",
			SessionOp: protocol.SessionOp{RequestID: "req-late", Allow: &allow}})
		assert.NoError(t, err)
		reply <- r
	}()
	// The dispatcher reads the history through a consumer of its own: once
	// it exists, the request is not in what it reads.
	fleettest.Eventually(t, wait, func() bool { return consumers() > before }, "the dispatcher reading the query's history")
	status(protocol.StatusEvent{State: protocol.StateAwaitingApproval, Attempt: 1,
		SessionStatus: protocol.SessionStatus{RequestID: "req-late", ToolName: "Bash"}})
	r := <-reply
	require.Nil(t, r.Error, "the approval was refused: %+v", r.Error)
}
