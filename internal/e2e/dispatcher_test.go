package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestStartOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	// A worker started before anything is provisioned waits for the consumer.
	f := fleettest.New(t, fleettest.Opts{})
	require.NoError(t, f.JS.DeleteStream(context.Background(), f.Names.JobsStream()))
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	require.False(t, w.W.Ready(), "no consumer yet")
	// Provisioning again (a dispatcher starting later) is idempotent.
	ctx := context.Background()
	require.NoError(t, provision.Streams(ctx, f.JS, provision.Config{Names: f.Names}))
	require.NoError(t, provision.Streams(ctx, f.JS, provision.Config{Names: f.Names}))
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "late-1", "hello")
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "late-1", wait).Final.State)
}

func TestMaxDeliveriesBecomeDeadLetters(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxDeliver: 2})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.OtherSandboxes = []string{protocol.SandboxCloudflare}
	}})
	fleettest.WaitReady(t, w.W)
	// This worker has no cloudflare provider but is told another worker
	// has, so it hands the job back each time (no such worker comes) until
	// MaxDeliver is reached.
	body, _ := json.Marshal(protocol.Job{ID: "dead-1", Prompt: "x", Sandbox: protocol.SandboxCloudflare})
	f.PublishJob("default", body, nil)
	r := f.Follow("default", "dead-1", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeMaxDeliveries, r.Final.Error.Code)
	require.Len(t, r.Lines, 1, "the stream ends with a result line")
	res, err := protocol.ParseMessage(r.Lines[0].Data).AsResult()
	require.NoError(t, err)
	require.Equal(t, protocol.ReasonMaxDeliveries, res.XFleet.Reason)

	ctx := context.Background()
	// The job was copied to the tenant's dead-letter subject with the reason...
	dlq, err := f.JS.Stream(ctx, f.Names.DLQStream())
	require.NoError(t, err)
	m, err := dlq.GetLastMsgForSubject(ctx, f.Names.DLQ("default"))
	require.NoError(t, err)
	require.Equal(t, string(body), string(m.Data))
	require.Equal(t, protocol.CodeMaxDeliveries, m.Header.Get(protocol.HeaderReason))
	// ...where ls --dlq shows it.
	code, out, errOut := runCLI(t, f.Srv.ClientURL(), "", "ls", "--dlq")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "dead-1")
	require.Contains(t, out, "max_deliveries")
	require.Contains(t, out, "delivered 2 times without finishing")
	// ...and removed from the work queue, where it would otherwise stay.
	jobs, err := f.JS.Stream(ctx, f.Names.JobsStream())
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		info, err := jobs.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, "job removed from FLEET_JOBS")
	// The transcript holds the synthetic result.
	tr := f.Transcript(f.Objects, "default", "dead-1")
	require.Equal(t, string(r.Lines[0].Data)+"\n", string(tr))
}

func TestStatusIndexSurvivesDispatcherRestart(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "idx-1", "hello")
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "idx-1", wait).Final.State)
	ctx := context.Background()
	fleettest.Eventually(t, wait, func() bool {
		ev, err := storage.GetStatus(ctx, f.Objects, "default", "idx-1")
		return err == nil && ev.State == protocol.StateSucceeded
	}, "status indexed in storage")
	// idx-2 is admitted and running when the dispatcher stops; it ends
	// while the dispatcher is down (a running job needs no dispatcher; a
	// queued one waits for an admitter).
	sub, err := f.NC.SubscribeSync(f.Names.QueryStatus("default", "idx-2"))
	require.NoError(t, err)
	require.NoError(t, f.NC.Flush())
	f.SubmitJSON("default", "idx-2", "/standin sleep=3s while the dispatcher is down")
	for {
		m, err := sub.NextMsg(wait)
		require.NoError(t, err)
		if strings.Contains(string(m.Data), `"state":"running"`) {
			break
		}
	}
	require.NoError(t, f.Disp.Stop(ctx))

	// A new dispatcher on the same storage answers from the index, and the
	// index is complete even for events published while it was down.
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "idx-2", wait).Final.State)
	d2, err := dispatcher.New(dispatcher.Config{NC: f.NC, Status: f.Objects, Objects: f.Objects, Provision: provision.Config{Names: f.Names}})
	require.NoError(t, err)
	require.NoError(t, d2.Start(ctx))
	t.Cleanup(func() { _ = d2.Stop(context.Background()) })
	rep, err := f.Client.Status(ctx, protocol.QueryRef{ID: "idx-1"})
	require.NoError(t, err)
	require.Equal(t, protocol.StateSucceeded, rep.Status.State)
	fleettest.Eventually(t, wait, func() bool {
		ev, err := storage.GetStatus(ctx, f.Objects, "default", "idx-2")
		return err == nil && ev.State == protocol.StateSucceeded
	}, "events published while the dispatcher was down are indexed")
	ls, err := f.Client.List(ctx, protocol.ListRequest{})
	require.NoError(t, err)
	require.Len(t, ls.Queries, 2)
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx := context.Background()
	rep, err := f.Client.Submit(ctx, protocol.Job{Prompt: ""})
	require.NoError(t, err)
	require.Equal(t, protocol.CodeInvalidJob, rep.Error.Code)
	require.Contains(t, rep.Error.Message, "prompt")

	st, err := f.Client.Status(ctx, protocol.QueryRef{ID: "nope"})
	require.NoError(t, err)
	require.Equal(t, protocol.CodeNotFound, st.Error.Code)

	st, err = f.Client.Status(ctx, protocol.QueryRef{ID: "../etc"})
	require.NoError(t, err)
	require.Equal(t, protocol.CodeInvalidJob, st.Error.Code)

	// A msgpack submit works like JSON.
	var body bytes.Buffer
	body.WriteString(`{"prompt":"hi","tenant":"acme","id":"api-1"}`)
	m, err := f.NC.Request(f.Names.APISubmit(), body.Bytes(), 10*time.Second)
	require.NoError(t, err)
	var sr protocol.SubmitReply
	require.NoError(t, json.Unmarshal(m.Data, &sr))
	require.Nil(t, sr.Error)
	require.Equal(t, "api-1", sr.ID)
	require.Equal(t, "acme", sr.Tenant)

	// Cancelling a query that already ended says so.
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	require.Equal(t, protocol.StateSucceeded, f.Follow("acme", "api-1", wait).Final.State)
	fleettest.Eventually(t, wait, func() bool {
		c, err := f.Client.Cancel(ctx, protocol.QueryRef{ID: "api-1", Tenant: "acme"})
		return err == nil && c.Error != nil && c.Error.Code == "already_finished"
	}, "cancel of a finished query is refused")
}

var _ = jetstream.ErrMsgNotFound
