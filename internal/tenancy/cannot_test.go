package tenancy_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// cannot is a fleet with tenant a's query q1 on FLEET_QUERIES, and tenant
// b connected with its own creds.
type cannot struct {
	*setup
	f        *fleettest.Fleet
	adm, b   *nats.Conn
	admJS    jetstream.JetStream
	bErrs    chan error
	bClient  *fleetapi.Client
	bLegacy  nats.JetStreamContext
	aCreds   string
	nonce    string
	queries  jetstream.Stream
	observed chan *nats.Msg
}

func newCannot(t *testing.T) *cannot {
	s := newSetup(t)
	c := &cannot{setup: s, nonce: nuid.Next(), bErrs: make(chan error, 64), observed: make(chan *nats.Msg, 4096)}
	c.f = fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	c.adm = s.role(tenancy.AdminFile, "client")
	c.admJS = jsOf(t, c.adm)
	for _, kind := range []string{"msg", "status"} {
		_, err := c.admJS.Publish(ctxT(t, 10*time.Second), "fleet.query.a.q1."+kind, []byte(`{"id":"q1","tenant":"a","state":"running"}`))
		require.NoError(t, err)
	}
	var err error
	c.queries, err = c.admJS.Stream(ctxT(t, 10*time.Second), "FLEET_QUERIES")
	require.NoError(t, err)
	c.aCreds = s.creds("a", 0)
	c.b = s.connect(s.creds("b", 0), c.bErrs)
	c.bClient, err = fleetapi.NewTenantClient(c.b, protocol.NewNames(""), tenancy.JSAPIPrefix)
	require.NoError(t, err)
	c.bLegacy, err = c.b.JetStream(nats.APIPrefix(tenancy.JSAPIPrefix), nats.MaxWait(3*time.Second))
	require.NoError(t, err)
	// The fleet side sees everything published in FLEET.
	sub, err := c.adm.ChanSubscribe(">", c.observed)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, c.adm.Flush())
	return c
}

// onlyBarrier runs denied (b's publishes carrying c.nonce), then publishes
// the barrier (b's own .ctl, which reaches FLEET), and fails if anything
// carrying the nonce reached FLEET before the barrier did. One
// connection's messages reach a subscriber in order, so once the barrier
// is seen nothing published before it can still arrive.
func (c *cannot) onlyBarrier(t *testing.T, denied func(payload []byte)) {
	t.Helper()
	payload := []byte(`{"op":"cancel","nonce":"` + c.nonce + `"}`)
	denied(payload)
	barrier := "fleet.query.b.barrier" + nuid.Next()[:6] + ".ctl"
	require.NoError(t, c.b.Publish(barrier, payload))
	require.NoError(t, c.b.Flush())
	for {
		select {
		case m := <-c.observed:
			if !strings.Contains(string(m.Data), c.nonce) {
				continue
			}
			require.Equal(t, barrier, m.Subject, "a message of b's reached FLEET on %s", m.Subject)
			return
		case <-time.After(30 * time.Second):
			t.Fatal("the barrier never reached FLEET")
		}
	}
}

func (c *cannot) requireNoMsg(t *testing.T, subject string) {
	t.Helper()
	_, err := c.queries.GetLastMsgForSubject(ctxT(t, 10*time.Second), subject)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "something was stored on %s", subject)
}

func TestTenantCannot(t *testing.T) {
	c := newCannot(t)

	t.Run("subscribe to another tenant's subjects", func(t *testing.T) {
		other, all, own := make(chan *nats.Msg, 8), make(chan *nats.Msg, 8), make(chan *nats.Msg, 8)
		for subj, ch := range map[string]chan *nats.Msg{"fleet.query.a.>": other, "fleet.query.>": all, "fleet.query.b.>": own} {
			sub, err := c.b.ChanSubscribe(subj, ch)
			require.NoError(t, err)
			defer func() { _ = sub.Unsubscribe() }()
		}
		require.NoError(t, c.b.Flush())
		require.NoError(t, c.adm.Publish("fleet.query.a.q1.msg", []byte("a's line")))
		require.NoError(t, c.adm.Publish("fleet.query.b.q1.msg", []byte("b's line")))
		require.NoError(t, c.adm.Flush())
		select {
		case m := <-own:
			require.Equal(t, "b's line", string(m.Data))
		case <-time.After(30 * time.Second):
			t.Fatal("b did not get its own line")
		}
		// b's own line went out after a's: a's would be here by now.
		require.Empty(t, other, "b read a's subjects")
		for len(all) > 0 {
			require.NotEqual(t, "a's line", string((<-all).Data), "b read a's subjects through fleet.query.>")
		}
	})

	t.Run("publish another tenant's jobs or .ctl, its own .msg/.status, work or dead letters", func(t *testing.T) {
		c.onlyBarrier(t, func(p []byte) {
			for _, subj := range []string{"fleet.jobs.a", "fleet.query.a.q1.ctl", "fleet.query.b.q1.msg", "fleet.query.b.q1.status",
				"fleet.work.b", "fleet.work.a", "fleet.dlq.b", "$KV.FLEET_TENANTS.b", "$O.FLEET_TRANSCRIPTS.C.x", "$JS.API.STREAM.PURGE.FLEET_QUERIES", "fleet.tapi.a.status", "fleet.tjs.a.STREAM.MSG.GET.FLEET_QUERIES"} {
				require.NoError(t, c.b.Publish(subj, p))
			}
		})
		_, err := c.bLegacy.Publish("fleet.jobs.a", []byte(`{"id":"x","prompt":"p"}`))
		require.Error(t, err, "a JetStream publish of a's job was acknowledged")
		c.requireNoMsg(t, "fleet.query.a.q1.ctl")
		// A header asking the stream to roll up (purge) is refused, not obeyed.
		_, err = c.bLegacy.PublishMsg(&nats.Msg{Subject: "fleet.query.b.q1.ctl", Data: []byte(`{"op":"cancel"}`),
			Header: nats.Header{"Nats-Rollup": []string{"all"}}})
		require.Error(t, err)
		_, err = c.queries.GetLastMsgForSubject(ctxT(t, 10*time.Second), "fleet.query.a.q1.msg")
		require.NoError(t, err, "a's messages are still there")
	})

	t.Run("make the server write through a reply subject", func(t *testing.T) {
		// A PubAck of b's own job, sent to a reply subject naming a's status,
		// the work queue or a dead letter, lands in b's account only.
		c.onlyBarrier(t, func(p []byte) {
			for i, reply := range []string{"fleet.query.a.q2.status", "fleet.query.b.q2.status", "fleet.work.evil", "fleet.dlq.evil"} {
				job, _ := json.Marshal(protocol.Job{ID: "refl" + string(rune('0'+i)), Prompt: string(p)})
				require.NoError(t, c.b.PublishRequest("fleet.jobs.b", reply, job))
				require.NoError(t, c.b.PublishRequest("fleet.query.b.q1.ctl", reply, p))
			}
		})
		c.requireNoMsg(t, "fleet.query.a.q2.status")
		c.requireNoMsg(t, "fleet.query.b.q2.status")
	})

	t.Run("consume or replay another tenant's subjects", func(t *testing.T) {
		arch, err := c.queries.Consumer(ctxT(t, 10*time.Second), "archiver")
		require.NoError(t, err)
		archFilter := arch.CachedInfo().Config.FilterSubject
		_, err = c.bClient.JS.OrderedConsumer(ctxT(t, 10*time.Second), "FLEET_QUERIES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fleet.query.a.>"}})
		require.Error(t, err)
		_, err = c.bClient.Follow(ctxT(t, 10*time.Second), "a", "q1", false, fleetapi.Follower{})
		require.Error(t, err)
		for _, tc := range []struct{ subject, body string }{
			{"CONSUMER.CREATE.FLEET_QUERIES.evil1.fleet.query.a.>", `{"stream_name":"FLEET_QUERIES","config":{"name":"evil1","filter_subject":"fleet.query.a.>"}}`},
			{"CONSUMER.CREATE.FLEET_QUERIES.evil2", `{"stream_name":"FLEET_QUERIES","config":{"name":"evil2"}}`},
			{"CONSUMER.CREATE.FLEET_QUERIES.evil3.fleet.query.b.>", `{"stream_name":"FLEET_QUERIES","config":{"name":"evil3","filter_subject":"fleet.query.b.>","deliver_subject":"fleet.work.evil"}}`},
			{"CONSUMER.CREATE.FLEET_QUERIES.evil4.fleet.query.b.>", `{"stream_name":"FLEET_QUERIES","config":{"durable_name":"evil4","filter_subject":"fleet.query.b.>"}}`},
			{"CONSUMER.CREATE.FLEET_QUERIES.evil5.fleet.query.b.>", `{"stream_name":"FLEET_QUERIES","config":{"name":"evil5","filter_subject":"fleet.query.b.>","filter_subjects":["fleet.query.a.>"]}}`},
			{"CONSUMER.CREATE.FLEET_QUERIES.archiver.fleet.query.b.>", `{"stream_name":"FLEET_QUERIES","config":{"name":"archiver","filter_subject":"fleet.query.b.>"}}`},
		} {
			r, err := c.b.Request(tenancy.JSAPIPrefix+"."+tc.subject, []byte(tc.body), 5*time.Second)
			if err == nil {
				require.Contains(t, string(r.Data), `"error"`, tc.subject)
			}
		}
		for _, name := range []string{"evil1", "evil2", "evil3", "evil4", "evil5"} {
			_, err := c.queries.Consumer(ctxT(t, 10*time.Second), name)
			require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, name)
		}
		arch, err = c.queries.Consumer(ctxT(t, 10*time.Second), "archiver")
		require.NoError(t, err)
		require.Equal(t, archFilter, arch.CachedInfo().Config.FilterSubject, "b changed the archiver's filter")
	})

	t.Run("pull from the fleet's durables or touch another tenant's reader", func(t *testing.T) {
		// A durable of the fleet's name over a's subjects (the running
		// fleet's own keep taking messages; this one holds still).
		d, err := c.queries.CreateConsumer(ctxT(t, 10*time.Second), jetstream.ConsumerConfig{Durable: "dispatcher-spend", FilterSubject: "fleet.query.a.>", AckPolicy: jetstream.AckExplicitPolicy})
		require.NoError(t, err)
		reader, err := c.queries.CreateConsumer(ctxT(t, 10*time.Second), jetstream.ConsumerConfig{Name: "areader", FilterSubject: "fleet.query.a.>", InactiveThreshold: time.Minute})
		require.NoError(t, err)
		_ = reader
		got := make(chan *nats.Msg, 8)
		sub, err := c.b.ChanSubscribe("_INBOX.pull."+c.nonce, got)
		require.NoError(t, err)
		defer func() { _ = sub.Unsubscribe() }()
		require.NoError(t, c.b.PublishRequest(tenancy.JSAPIPrefix+".CONSUMER.MSG.NEXT.FLEET_QUERIES.dispatcher-spend", "_INBOX.pull."+c.nonce, []byte(`{"batch":1,"no_wait":true}`)))
		for _, call := range []string{"INFO", "DELETE"} {
			r, err := c.b.Request(tenancy.JSAPIPrefix+".CONSUMER."+call+".FLEET_QUERIES.areader", nil, 5*time.Second)
			require.NoError(t, err)
			require.Contains(t, string(r.Data), "not one of tenant b's readers")
		}
		_, err = c.queries.Consumer(ctxT(t, 10*time.Second), "areader")
		require.NoError(t, err, "b deleted a's reader")
		info, err := d.Info(ctxT(t, 10*time.Second))
		require.NoError(t, err)
		require.Zero(t, info.Delivered.Consumer, "b pulled from the fleet's durable")
		require.Empty(t, got)
	})

	t.Run("direct-get or message-get another tenant's subjects", func(t *testing.T) {
		_, err := c.bLegacy.GetLastMsg("FLEET_QUERIES", "fleet.query.a.q1.msg", nats.DirectGet())
		require.Error(t, err)
		_, err = c.bLegacy.GetLastMsg("FLEET_QUERIES", "fleet.query.a.q1.msg")
		require.Error(t, err)
		for _, tc := range []struct{ subject, body string }{
			{"DIRECT.GET.FLEET_QUERIES", `{"seq":1}`},
			{"DIRECT.GET.FLEET_QUERIES", `{"last_by_subj":"fleet.query.a.q1.msg"}`},
			{"STREAM.MSG.GET.FLEET_QUERIES", `{"seq":1}`},
			{"STREAM.MSG.GET.FLEET_QUERIES", `{"last_by_subj":"fleet.query.b.x","seq":1}`},
			{"DIRECT.GET.FLEET_QUERIES.fleet.query.a.q1.msg", ``},
		} {
			r, err := c.b.Request(tenancy.JSAPIPrefix+"."+tc.subject, []byte(tc.body), 5*time.Second)
			if err == nil {
				require.NotContains(t, string(r.Data), "a's line", tc.subject)
				require.NotContains(t, string(r.Data), `"tenant":"a"`, tc.subject)
				require.NotContains(t, r.Header.Get("Nats-Subject"), "fleet.query.a.", tc.subject)
			}
		}
		// The default API prefix is the account's own, with no JetStream.
		r, err := c.b.Request("$JS.API.DIRECT.GET.FLEET_QUERIES.fleet.query.a.q1.msg", nil, 5*time.Second)
		if err == nil {
			require.Empty(t, r.Header.Get("Nats-Subject"))
		}
	})

	t.Run("read another tenant's queries through the API", func(t *testing.T) {
		ctx := ctxT(t, 30*time.Second)
		st, err := c.bClient.Status(ctx, protocol.QueryRef{ID: "q1", Tenant: "a"})
		require.NoError(t, err)
		require.NotNil(t, st.Error)
		require.Nil(t, st.Status)
		st, err = c.bClient.Status(ctx, protocol.QueryRef{ID: "q1"})
		require.NoError(t, err)
		require.Equal(t, protocol.CodeNotFound, st.Error.Code, "b's status of q1 is b's q1")
		for _, body := range []string{`{"id":"q1","tenant":"a"}`, `{"id":"q1","Tenant":"a"}`, `{"id":"q1","TENANT":"a","tenant":"b"}`} {
			for _, op := range []string{"status", "cancel", "input", "end"} {
				r, err := c.b.Request("fleet.api."+op, []byte(body), 10*time.Second)
				require.NoError(t, err)
				require.Contains(t, string(r.Data), "not allowed for this tenant", op+" "+body)
			}
		}
		l, err := c.bClient.List(ctx, protocol.ListRequest{Tenant: "a"})
		require.NoError(t, err)
		require.Nil(t, l.Queries)
		l, err = c.bClient.List(ctx, protocol.ListRequest{})
		require.NoError(t, err)
		for _, q := range l.Queries {
			require.Equal(t, "b", q.Tenant)
		}
		r, err := c.b.Request("fleet.api.submit", []byte(`{"id":"x1","tenant":"a","prompt":"p"}`), 10*time.Second)
		require.NoError(t, err)
		require.Contains(t, string(r.Data), "not allowed for this tenant")
		c.requireNoMsg(t, "fleet.query.a.q1.ctl")
		c.requireNoMsg(t, "fleet.query.a.x1.status")
	})

	t.Run("admission settings, KV and object stores", func(t *testing.T) {
		for _, subj := range []string{"STREAM.INFO.KV_FLEET_TENANTS", "STREAM.INFO.FLEET_QUERIES", "STREAM.PURGE.FLEET_QUERIES", "STREAM.NAMES", "CONSUMER.LIST.FLEET_QUERIES"} {
			for _, prefix := range []string{tenancy.JSAPIPrefix, "$JS.API"} {
				r, err := c.b.Request(prefix+"."+subj, nil, 3*time.Second)
				if err == nil {
					require.Contains(t, string(r.Data), `"error"`, prefix+"."+subj)
				}
			}
		}
		_, err := c.b.Request("$KV.FLEET_TENANTS.b", []byte(`{"max_running":1000}`), 2*time.Second)
		require.Error(t, err)
		kv, err := c.admJS.KeyValue(ctxT(t, 10*time.Second), "FLEET_TENANTS")
		require.NoError(t, err)
		_, err = kv.Get(ctxT(t, 10*time.Second), "b")
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
		info, err := c.queries.Info(ctxT(t, 10*time.Second))
		require.NoError(t, err)
		require.NotZero(t, info.State.Msgs, "b purged FLEET_QUERIES")
	})

	t.Run("$SYS beyond USER.INFO, and another tenant's replies", func(t *testing.T) {
		_, err := c.b.Request("$SYS.REQ.SERVER.PING.CONNZ", nil, 2*time.Second)
		require.Error(t, err)
		r, err := c.b.Request("$SYS.REQ.USER.INFO", nil, 5*time.Second)
		require.NoError(t, err)
		require.Contains(t, string(r.Data), "tenant:b")
		// b listens on every inbox it may; a asks the API; b sees only its own reply.
		seen := make(chan *nats.Msg, 16)
		sub, err := c.b.ChanSubscribe("_INBOX.>", seen)
		require.NoError(t, err)
		defer func() { _ = sub.Unsubscribe() }()
		require.NoError(t, c.b.Flush())
		a := c.connect(c.aCreds, nil)
		_, err = a.Request("fleet.api.status", []byte(`{"id":"q1"}`), 10*time.Second)
		require.NoError(t, err)
		_, err = c.b.Request("fleet.api.status", []byte(`{"id":"q1"}`), 10*time.Second)
		require.NoError(t, err)
		for len(seen) > 0 {
			m := <-seen
			require.NotContains(t, string(m.Data), `"tenant":"a"`, "b read a's reply")
		}
	})
	select {
	case err := <-c.bErrs:
		require.True(t, errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation"), err.Error())
	default:
		t.Fatal("b was never refused by the server (permission violations expected)")
	}
}
