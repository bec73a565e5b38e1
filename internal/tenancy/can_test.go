package tenancy_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// A tenant's creds do all docs/tenancy.md says they can, against a fleet running
// on the fleet's own creds: jobs with PubAcks, the API, live subjects,
// replay (ordered consumers through the dispatcher's checks), direct gets
// and .ctl of its own queries.
func TestTenantCan(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)

	acmeCreds := s.creds("acme", 0)
	nc := s.connect(acmeCreds, nil)
	live := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe("fleet.query.acme.>", live)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, nc.Flush())

	// A job published straight to fleet.jobs.acme, with its PubAck.
	js := jsOf(t, nc)
	b, _ := json.Marshal(protocol.Job{ID: "direct1", Prompt: "hello"})
	ack, err := js.PublishMsg(ctxT(t, 10*time.Second), &nats.Msg{Subject: "fleet.jobs.acme", Data: b,
		Header: nats.Header{protocol.HeaderMsgID: []string{"acme.direct1"}}})
	require.NoError(t, err)
	require.Equal(t, "FLEET_JOBS", ack.Stream)

	// A job through the API, naming no tenant: it is acme's.
	c, err := fleetapi.NewTenantClient(nc, protocol.NewNames(""), tenancy.JSAPIPrefix)
	require.NoError(t, err)
	r, err := c.Submit(ctxT(t, 10*time.Second), protocol.Job{ID: "api1", Prompt: "hello"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Equal(t, "acme", r.Tenant)

	// Replay and follow both to their end as acme (ordered consumers).
	for _, id := range []string{"direct1", "api1"} {
		final, err := c.Follow(ctxT(t, time.Minute), "acme", id, true, fleetapi.Follower{})
		require.NoError(t, err, id)
		require.Equal(t, protocol.StateSucceeded, final.State, id)
	}
	// Status and list through the API.
	st, err := c.Status(ctxT(t, 10*time.Second), protocol.QueryRef{ID: "api1"})
	require.NoError(t, err)
	require.Nil(t, st.Error)
	require.Equal(t, "acme", st.Status.Tenant)
	var ids []string
	fleettest.Eventually(t, time.Minute, func() bool {
		l, err := c.List(ctxT(t, 10*time.Second), protocol.ListRequest{})
		require.NoError(t, err)
		ids = ids[:0]
		for _, q := range l.Queries {
			ids = append(ids, q.Tenant+"/"+q.ID)
		}
		return len(ids) == 2
	}, "both queries listed")
	slices.Sort(ids)
	require.Equal(t, []string{"acme/api1", "acme/direct1"}, ids)

	// Direct get of its own status subject (last by subject).
	legacy, err := nc.JetStream(nats.APIPrefix(tenancy.JSAPIPrefix))
	require.NoError(t, err)
	raw, err := legacy.GetLastMsg("FLEET_QUERIES", "fleet.query.acme.api1.status", nats.DirectGet())
	require.NoError(t, err)
	require.Contains(t, string(raw.Data), `"succeeded"`)

	// The live subscription saw the run's lines.
	sawResult := false
	for !sawResult {
		select {
		case m := <-live:
			sawResult = m.Subject == "fleet.query.acme.api1.msg" && json.Valid(m.Data) && containsType(m.Data, "result")
		case <-time.After(time.Minute):
			t.Fatal("no result line live on fleet.query.acme.>")
		}
	}

	// .ctl on its own query is stored in FLEET_QUERIES.
	require.NoError(t, nc.Publish("fleet.query.acme.api1.ctl", []byte(`{"op":"cancel"}`)))
	require.NoError(t, nc.Flush())
	fleettest.Eventually(t, 30*time.Second, func() bool {
		st, err := f.JS.Stream(ctxT(t, 5*time.Second), "FLEET_QUERIES")
		require.NoError(t, err)
		_, err = st.GetLastMsgForSubject(ctxT(t, 5*time.Second), "fleet.query.acme.api1.ctl")
		return err == nil
	}, "acme's .ctl stored")

	// The archiver (on the dispatcher's creds) stored the transcript, and
	// an admin (admin.creds) sets the tenant's admission settings.
	fleettest.Eventually(t, time.Minute, func() bool {
		_, err := f.Objects.Get(ctxT(t, 5*time.Second), storage.TranscriptKey("acme", "api1"))
		return err == nil
	}, "acme's transcript archived")
	admin := filepath.Join(s.Dir.Path, tenancy.AdminFile)
	code, _, errs := cli(t, "tenant", "set", "acme", "--max-running", "3", "--nats-url", s.Srv.ClientURL(), "--nats-creds", admin)
	require.Equal(t, 0, code, errs)
	code, out, errs := cli(t, "tenant", "get", "acme", "--nats-url", s.Srv.ClientURL(), "--nats-creds", admin)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "3")
	// The tenant's own creds may not.
	code, _, _ = cli(t, "tenant", "set", "acme", "--max-running", "100", "--nats-url", s.Srv.ClientURL(), "--nats-creds", acmeCreds, "--timeout", "3s")
	require.NotEqual(t, 0, code)
	kv, err := f.JS.KeyValue(ctxT(t, 5*time.Second), "FLEET_TENANTS")
	require.NoError(t, err)
	e, err := kv.Get(ctxT(t, 5*time.Second), "acme")
	require.NoError(t, err)
	require.NotContains(t, string(e.Value()), "100")
}

func containsType(line []byte, typ string) bool {
	var v struct{ Type string }
	return json.Unmarshal(line, &v) == nil && v.Type == typ
}
