package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// workerSubs lists the subjects the worker's connection subscribes to, as
// the server sees them.
func workerSubs(t *testing.T, srv *server.Server, nc *nats.Conn) []string {
	t.Helper()
	cid, err := nc.GetClientID()
	require.NoError(t, err)
	cz, err := srv.Connz(&server.ConnzOptions{CID: cid, Subscriptions: true})
	require.NoError(t, err)
	require.Len(t, cz.Conns, 1)
	return cz.Conns[0].Subs
}

// TestOneCtlSubscriptionPerWorker: the worker listens for cancels on one
// subscription for all its queries, not a SUB and an UNSUB per job: while
// jobs run, its connection has exactly the subscriptions it had idle, none
// for a query's subjects, and a cancel still reaches the run.
func TestOneCtlSubscriptionPerWorker(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	var nc *nats.Conn
	started := make(chan string, 4)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2, Mod: func(c *worker.Config) {
		nc = c.NC
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}})
	fleettest.WaitReady(t, w.W)
	idle := workerSubs(t, f.Srv, nc)
	require.Contains(t, idle, f.Names.CtlWildcard())

	f.SubmitJSON("default", "subs1", "/standin sleep=1h")
	f.SubmitJSON("default", "subs2", "/standin sleep=1h")
	got := map[string]bool{recv(t, started): true, recv(t, started): true}
	require.Equal(t, map[string]bool{"subs1": true, "subs2": true}, got)
	busy := workerSubs(t, f.Srv, nc)
	for _, s := range busy {
		require.False(t, strings.Contains(s, ".query.default.subs"), "a per-query subscription")
	}
	require.ElementsMatch(t, idle, busy, "running two jobs adds no subscription")

	// The cancel of one of them reaches its run through the wildcard.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := f.JS.Publish(ctx, f.Names.QueryCtl("default", "subs1"), []byte(`{"op":"cancel"}`))
	require.NoError(t, err)
	r := f.Follow("default", "subs1", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	_, err = f.JS.Publish(ctx, f.Names.QueryCtl("default", "subs2"), []byte(`{"op":"cancel"}`))
	require.NoError(t, err)
	r = f.Follow("default", "subs2", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
}

// TestOnePullRequestForAllFreeSlots: an idle worker asks for as many jobs
// as it has slots in one pull request; once every slot is busy it asks for
// nothing, and when one frees it asks for one.
func TestOnePullRequestForAllFreeSlots(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	reqs, err := f.NC.SubscribeSync("$JS.API.CONSUMER.MSG.NEXT." + f.Names.JobsStream() + "." + f.Names.Consumer())
	require.NoError(t, err)
	batch := func(m *nats.Msg) int {
		var r struct {
			Batch int `json:"batch"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &r))
		return r.Batch
	}
	started := make(chan string, 4)
	f.StartWorker(fleettest.WorkerOpts{Slots: 3, Mod: func(c *worker.Config) {
		c.PullExpiry = 5 * time.Minute // no re-ask on expiry during the test
		c.PullHeartbeat = 20 * time.Second
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}})
	m, err := reqs.NextMsg(wait)
	require.NoError(t, err)
	require.Equal(t, 3, batch(m), "one request for the three free slots")

	for _, id := range []string{"pull1", "pull2", "pull3"} {
		f.SubmitJSON("default", id, "/standin sleep=1h")
	}
	for range 3 {
		recv(t, started)
	}
	// Every request the worker sent so far is in reqs once the server
	// answered a PING sent after them.
	require.NoError(t, f.NC.Flush())
	n, _, err := reqs.Pending()
	require.NoError(t, err)
	for range n {
		m, err := reqs.NextMsg(wait)
		require.NoError(t, err)
		require.Equal(t, 3, batch(m), "no request while the first is not filled")
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = f.JS.Publish(ctx, f.Names.QueryCtl("default", "pull2"), []byte(`{"op":"cancel"}`))
	require.NoError(t, err)
	m, err = reqs.NextMsg(wait)
	require.NoError(t, err)
	require.Equal(t, 1, batch(m), "one slot freed: a request for one job")
	for _, id := range []string{"pull1", "pull3"} {
		_, err = f.JS.Publish(ctx, f.Names.QueryCtl("default", id), []byte(`{"op":"cancel"}`))
		require.NoError(t, err)
	}
	for _, id := range []string{"pull1", "pull2", "pull3"} {
		require.Equal(t, protocol.StateCancelled, f.Follow("default", id, wait).Final.State)
	}
}
