package tenancy_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// A tenant's consumer create that nats-server would read as a push
// consumer delivering in FLEET (a deliver subject spelt with U+017F, the
// Kelvin sign, other cases, escapes, twice) is refused by the dispatcher's
// proxy: no consumer is made, nothing reaches the worker's drain subject
// or the advisories the dispatcher acts on.
func TestTenantProxyRefusesFoldedKeys(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	adm := s.role(tenancy.AdminFile, "client")
	queries, err := jsOf(t, adm).Stream(ctxT(t, 10*time.Second), "FLEET_QUERIES")
	require.NoError(t, err)
	_, err = jsOf(t, adm).Publish(ctxT(t, 10*time.Second), "fleet.query.b.q1.msg", []byte(`{"type":"x"}`))
	require.NoError(t, err)
	drained := make(chan *nats.Msg, 16)
	for _, subj := range []string{"fleet.worker.*.drain", "$JS.EVENT.ADVISORY.>"} {
		sub, err := adm.ChanSubscribe(subj, drained)
		require.NoError(t, err)
		defer func() { _ = sub.Unsubscribe() }()
	}
	require.NoError(t, adm.Flush())
	_ = f

	b := s.connect(s.creds("b", 0), nil)
	targets := []string{"fleet.worker.w1.drain", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.FLEET_JOBS.workers"}
	var attacks []string
	for _, target := range targets {
		for _, key := range []string{"deliver_ſubject", `deliver_\u017fubject`, "DELIVER_SUBJECT", "Deliver_Subject", `deliver\u005fsubject`} {
			attacks = append(attacks, fmt.Sprintf(`"%s":%q`, key, target))
		}
		attacks = append(attacks,
			fmt.Sprintf(`"deliver_subject":%q`, target),
			fmt.Sprintf(`"name":"NAME","name":"NAME","deliver_subject":%q`, target),
			fmt.Sprintf(`"deliver_group":"g","deliver_ſubject":%q`, target))
	}
	attacks = append(attacks, `"durable_name":"dur"`, `"durable_ꓠame":"dur"`, "\"durable_name\":\"dur\",\"\u212aey\":1",
		`"filter_ſubjects":["fleet.query.a.>"]`, `"metadata":{"a":"b"}`, `"ack_policy":"explicit","max_deliver":1`, `"unknown":1`)
	for i, attack := range attacks {
		name := fmt.Sprintf("evil%d", i)
		body := fmt.Sprintf(`{"stream_name":"FLEET_QUERIES","config":{"name":%q,"filter_subject":"fleet.query.b.q1.>",%s}}`, name, strings.ReplaceAll(attack, "NAME", name))
		r, err := b.Request(tenancy.JSAPIPrefix+".CONSUMER.CREATE.FLEET_QUERIES."+name+".fleet.query.b.q1.>", []byte(body), 10*time.Second)
		require.NoError(t, err, body)
		require.Contains(t, string(r.Data), `"error"`, body)
		_, err = queries.Consumer(ctxT(t, 10*time.Second), name)
		require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the proxy created %s", body)
	}
	// A plain reader still works, and nothing was delivered in FLEET.
	cons, err := jetstream.NewWithAPIPrefix(b, tenancy.JSAPIPrefix)
	require.NoError(t, err)
	oc, err := cons.OrderedConsumer(ctxT(t, 10*time.Second), "FLEET_QUERIES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fleet.query.b.q1.>"}})
	require.NoError(t, err)
	m, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
	require.NoError(t, err)
	require.Equal(t, "fleet.query.b.q1.msg", m.Subject())
	for len(drained) > 0 {
		d := <-drained
		require.NotContains(t, d.Subject, "drain")
		require.NotContains(t, d.Subject, "MAX_DELIVERIES")
		require.NotEqual(t, `{"type":"x"}`, string(d.Data), "a tenant's consumer delivered on %s", d.Subject)
	}
}

// fleetQueries publishes n lines on tenant's query id as the fleet does
// (through the admin's creds), with a final status.
func fleetQueries(t *testing.T, s *setup, tenant, id string, n int) {
	t.Helper()
	js := jsOf(t, s.role(tenancy.AdminFile, "client"))
	ctx := ctxT(t, time.Minute)
	for i := 1; i <= n; i++ {
		_, err := js.PublishAsync(fmt.Sprintf("fleet.query.%s.%s.msg", tenant, id), fmt.Appendf(nil, `{"type":"line","n":%d}`, i))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the lines")
	}
}

// A tenant replays a 500-line run whole and in order with ordered
// consumers through its API prefix, by Fetch, by Messages and by Consume.
func TestTenantReplayOrdered(t *testing.T) {
	s := newSetup(t)
	fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	const n = 500
	fleetQueries(t, s, "acme", "q1", n)
	fleetQueries(t, s, "other", "q1", 50)
	creds := s.creds("acme", 0)
	nc := s.connect(creds, nil)
	js, err := jetstream.NewWithAPIPrefix(nc, tenancy.JSAPIPrefix)
	require.NoError(t, err)
	open := func(t *testing.T) jetstream.Consumer {
		c, err := js.OrderedConsumer(ctxT(t, 30*time.Second), "FLEET_QUERIES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fleet.query.acme.q1.>"}})
		require.NoError(t, err)
		return c
	}
	check := func(t *testing.T, got []jetstream.Msg) {
		t.Helper()
		require.Len(t, got, n)
		for i, m := range got {
			var v struct{ N int }
			require.NoError(t, json.Unmarshal(m.Data(), &v))
			require.Equal(t, i+1, v.N)
		}
	}
	t.Run("fetch", func(t *testing.T) {
		c := open(t)
		var got []jetstream.Msg
		for len(got) < n {
			b, err := c.Fetch(100, jetstream.FetchMaxWait(30*time.Second))
			require.NoError(t, err)
			for m := range b.Messages() {
				got = append(got, m)
			}
			require.NoError(t, b.Error())
		}
		check(t, got)
	})
	t.Run("messages", func(t *testing.T) {
		it, err := open(t).Messages()
		require.NoError(t, err)
		defer it.Stop()
		var got []jetstream.Msg
		for len(got) < n {
			m, err := it.Next(jetstream.NextMaxWait(30 * time.Second))
			require.NoError(t, err)
			got = append(got, m)
		}
		check(t, got)
	})
	t.Run("cli tail", func(t *testing.T) {
		_, err := jsOf(t, s.role(tenancy.AdminFile, "client")).Publish(ctxT(t, 10*time.Second), "fleet.query.acme.q1.status",
			[]byte(`{"v":1,"id":"q1","tenant":"acme","state":"succeeded"}`))
		require.NoError(t, err)
		code, out, errs := cli(t, "tail", "q1", "--raw", "--nats-url", s.Srv.ClientURL(), "--nats-creds", creds)
		require.Equal(t, 0, code, errs)
		var want strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&want, `{"type":"line","n":%d}`+"\n", i)
		}
		require.Contains(t, out, want.String())
	})
	t.Run("consume", func(t *testing.T) {
		ch := make(chan jetstream.Msg, n)
		cc, err := open(t).Consume(func(m jetstream.Msg) { ch <- m })
		require.NoError(t, err)
		defer cc.Stop()
		var got []jetstream.Msg
		for len(got) < n {
			select {
			case m := <-ch:
				got = append(got, m)
			case <-time.After(time.Minute):
				t.Fatalf("consume stopped after %d of %d lines", len(got), n)
			}
		}
		check(t, got)
	})
}
