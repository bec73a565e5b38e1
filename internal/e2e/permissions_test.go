package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/discovery"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// The fleet runs on the shipped deploy/nats/nats-server.conf with every role
// on its own user and inbox prefix, and each role is refused what it must
// not do.
func TestDeployConfigPermissions(t *testing.T) {
	// t.Setenv (the config's passwords come from the environment): not parallel.
	for _, role := range []string{"DISPATCHER", "WORKER", "PRODUCER", "SUBSCRIBER", "CLIENT", "SYS"} {
		t.Setenv("FLEET_"+role+"_PASSWORD", "pw-"+role)
	}
	opts, err := server.ProcessConfigFile("../../deploy/nats/nats-server.conf")
	require.NoError(t, err)
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir, opts.NoLog, opts.NoSigs = t.TempDir(), true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })

	violations := make(chan string, 64)
	connect := func(t testing.TB, role string) *nats.Conn {
		user := role
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, "pw-"+map[string]string{
			"dispatcher": "DISPATCHER", "worker": "WORKER", "producer": "PRODUCER", "subscriber": "SUBSCRIBER", "client": "CLIENT",
		}[role]), nats.CustomInboxPrefix("_INBOX_"+role), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			violations <- role + ": " + err.Error()
		}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	f := fleettest.New(t, fleettest.Opts{Server: srv, Connect: connect})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)

	// A producer publishes a job directly, with a JetStream ack.
	prod := connect(t, "producer")
	pjs, err := jetstream.New(prod)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, _ := json.Marshal(protocol.Job{ID: "perm-1", Prompt: "hello"})
	_, err = pjs.Publish(ctx, f.Names.JobSubject("default"), body)
	require.NoError(t, err)
	// The client (CLI user) follows it through an ordered consumer.
	r := f.Follow("default", "perm-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	fleettest.RequireContiguous(t, r)
	// And through the dispatcher's API.
	rep, err := f.Client.Submit(ctx, protocol.Job{ID: "perm-2", Prompt: "via the API"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "perm-2", wait).Final.State)

	// A workspace job: the worker publishes its .artifact; the client reads it back.
	repo := workspacetest.NewRepo(t, t.TempDir())
	wsJob, _ := json.Marshal(protocol.Job{ID: "perm-ws", Prompt: "/standin append=x.txt", Workspace: &protocol.Workspace{Repo: repo.URL}})
	f.PublishJob("default", wsJob, nil)
	require.Equal(t, protocol.StateSucceeded, f.Follow("default", "perm-ws", wait).Final.State)
	art, err := f.Client.Artifact(ctx, "default", "perm-ws")
	require.NoError(t, err, "the worker published the artifact and the client may read it")
	require.Equal(t, repo.Main, art.StartSHA)

	// A subscriber tails live with a core subscription.
	sub := connect(t, "subscriber")
	s, err := sub.SubscribeSync("fleet.query.default.*.msg")
	require.NoError(t, err)
	require.NoError(t, sub.Flush())
	f.SubmitJSON("default", "perm-3", "live")
	_, err = s.NextMsg(wait)
	require.NoError(t, err)

	// A session: the worker reads its input log (an ordered consumer of
	// the query's .ctl), the producer sends an input through the API and
	// ends it on .ctl.
	sess, _ := json.Marshal(protocol.Job{ID: "perm-s", Prompt: "hello session", Session: &protocol.Session{}})
	_, err = pjs.Publish(ctx, f.Names.JobSubject("default"), sess)
	require.NoError(t, err)
	in, _ := json.Marshal(protocol.SessionOpRequest{ID: "perm-s", SessionOp: protocol.SessionOp{Text: "second"}})
	fleettest.Eventually(t, wait, func() bool {
		m, err := prod.Request(f.Names.APISessionOp(protocol.OpInput), in, 10*time.Second)
		var rep protocol.APIReply
		return err == nil && json.Unmarshal(m.Data, &rep) == nil && rep.OK
	}, "the dispatcher accepts an input for the session")
	end, _ := json.Marshal(protocol.CtlOp{Op: protocol.OpEnd})
	_, err = pjs.Publish(ctx, f.Names.QueryCtl("default", "perm-s"), end)
	require.NoError(t, err)
	r = f.Follow("default", "perm-s", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Turn)

	// Discovery: the worker's micro service answers the client (workers,
	// queue position, drain's subject) and the dispatcher; the
	// dispatcher's "agentfleet" service answers $SRV requests.
	ctx, cancel = context.WithTimeout(context.Background(), wait)
	defer cancel()
	ws, err := discovery.ServeWorker(w.NC, f.Names, discovery.Worker{ID: w.W.ID(), Info: w.W.Info, Drain: func() {}})
	require.NoError(t, err)
	defer func() { _ = ws.Stop() }()
	infos, err := f.Client.Workers(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	require.Equal(t, w.W.ID(), infos[0].ID)
	q, err := f.Client.Queue(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, 1, q.Workers)
	dc, err := fleetapi.NewClient(f.NC, f.Names)
	require.NoError(t, err)
	infos, err = dc.Workers(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1, "the dispatcher finds the workers too (for the dashboard and metrics)")
	_, err = f.Client.Drain(ctx, "no-such-worker")
	require.ErrorIs(t, err, fleetapi.ErrNotFound)
	m, err := f.NC.Request("$SRV.INFO.agentfleet", nil, wait)
	require.NoError(t, err)
	require.Contains(t, string(m.Data), `"subject":"fleet.api.submit"`)

	select {
	case v := <-violations:
		t.Fatalf("a role was refused something it needs: %s", v)
	default:
	}

	// What roles must not do.
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	wjs, err := jetstream.New(w.NC)
	require.NoError(t, err)
	_, err = wjs.Publish(sctx, f.Names.JobSubject("default"), body)
	require.Error(t, err, "a worker cannot publish jobs")
	_, err = pjs.Publish(sctx, f.Names.WorkSubject("default"), body)
	require.Error(t, err, "a producer cannot bypass admission")
	_, err = wjs.Publish(sctx, f.Names.WorkSubject("default"), body)
	require.Error(t, err, "a worker cannot put work where workers pull")
	_, err = pjs.CreateOrUpdateConsumer(sctx, f.Names.JobsStream(), jetstream.ConsumerConfig{Durable: "rogue", AckPolicy: jetstream.AckExplicitPolicy})
	require.Error(t, err, "a producer cannot create consumers")
	sjs, err := jetstream.New(sub)
	require.NoError(t, err)
	_, err = sjs.Publish(sctx, f.Names.QueryMsg("default", "perm-1"), []byte(`{"type":"result"}`))
	require.Error(t, err, "a subscriber cannot write into a query")
	var reported []string
	for len(violations) > 0 {
		reported = append(reported, <-violations)
	}
	require.NotEmpty(t, reported, "the server reported the permission violations")
	require.Contains(t, strings.Join(reported, "\n"), "Permissions Violation")
}
