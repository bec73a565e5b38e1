package tenancy_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// proxied is a server with FLEET_QUERIES and a JSProxy whose upstream
// ($JS.SLOW.API) is answered by the test: calls on a consumer named
// hang* are held until release is closed, the others are passed on to
// the server's $JS.API.
type proxied struct {
	*setup
	held    chan string
	release chan struct{}
}

func newProxied(t testing.TB, o tenancy.ProxyOptions) *proxied {
	s := newSetup(t)
	adm := s.role(tenancy.AdminFile, "client")
	_, err := jsOf(t, adm).CreateStream(ctxT(t, 30*time.Second), jetstream.StreamConfig{Name: "FLEET_QUERIES", Subjects: []string{"fleet.query.>"}, AllowDirect: true})
	require.NoError(t, err)
	p := &proxied{setup: s, held: make(chan string, 16), release: make(chan struct{})}
	sub, err := adm.Subscribe("$JS.SLOW.API.>", func(m *nats.Msg) {
		call := strings.TrimPrefix(m.Subject, "$JS.SLOW.API.")
		if strings.Contains(call, ".hang") {
			p.held <- call
			go func() {
				<-p.release
				_ = m.Respond([]byte(`{"error":{"code":404,"err_code":10014,"description":"consumer not found"}}`))
			}()
			return
		}
		r, err := adm.Request("$JS.API."+call, m.Data, 10*time.Second)
		if err == nil {
			_ = m.Respond(r.Data)
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	o.Upstream = "$JS.SLOW.API"
	px, err := tenancy.ServeJSWith(adm, "fleet", o)
	require.NoError(t, err)
	t.Cleanup(func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
		require.NoError(t, px.Stop(context.Background()))
	})
	require.NoError(t, adm.Flush())
	return p
}

// One tenant's request whose upstream never answers holds up neither
// another tenant's requests nor its own others; a tenant over its limit
// of requests in flight is refused at once.
func TestTenantProxyConcurrent(t *testing.T) {
	p := newProxied(t, tenancy.ProxyOptions{Timeout: 5 * time.Minute, MaxPerTenant: 2})
	b := p.connect(p.creds("b", 0), nil)
	a := p.connect(p.creds("a", 0), nil)
	bDone := make(chan error, 2)
	for _, name := range []string{"hang1", "hang2"} {
		go func() {
			_, err := b.Request(tenancy.JSAPIPrefix+".CONSUMER.INFO.FLEET_QUERIES."+name, nil, 5*time.Minute)
			bDone <- err
		}()
		require.Contains(t, <-p.held, name)
	}
	// b is at its limit: refused at once, not queued.
	r, err := b.Request(tenancy.JSAPIPrefix+".CONSUMER.INFO.FLEET_QUERIES.other", nil, time.Minute)
	require.NoError(t, err)
	require.Contains(t, string(r.Data), "busy")
	// a's reader is created, read and given back meanwhile.
	js, err := jetstream.NewWithAPIPrefix(a, tenancy.JSAPIPrefix)
	require.NoError(t, err)
	_, err = jsOf(t, p.role(tenancy.AdminFile, "client")).Publish(ctxT(t, 10*time.Second), "fleet.query.a.q1.msg", []byte("a's line"))
	require.NoError(t, err)
	c, err := js.OrderedConsumer(ctxT(t, time.Minute), "FLEET_QUERIES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fleet.query.a.q1.>"}})
	require.NoError(t, err)
	m, err := c.Next(jetstream.FetchMaxWait(time.Minute))
	require.NoError(t, err)
	require.Equal(t, "a's line", string(m.Data()))
	_, err = c.Info(ctxT(t, time.Minute))
	require.NoError(t, err)
	require.Empty(t, bDone, "b's held requests were answered before a's went through")
	close(p.release)
	for range 2 {
		require.NoError(t, <-bDone)
	}
}

// BenchmarkConsumerCreate compares a reader's consumer create through the
// proxy (a tenant's creds) with the same request sent straight to the
// JetStream API (the fleet's creds).
func BenchmarkConsumerCreate(b *testing.B) {
	s := newSetup(b)
	adm := s.role(tenancy.AdminFile, "client")
	admJS := jsOf(b, adm)
	_, err := admJS.CreateStream(ctxT(b, 30*time.Second), jetstream.StreamConfig{Name: "FLEET_QUERIES", Subjects: []string{"fleet.query.>"}})
	require.NoError(b, err)
	px, err := tenancy.ServeJS(s.role(tenancy.DispatcherFile, "dispatcher"), "fleet")
	require.NoError(b, err)
	b.Cleanup(func() { _ = px.Stop(context.Background()) })
	tenant := s.connect(s.creds("acme", 0), nil)
	for _, tc := range []struct {
		name   string
		nc     *nats.Conn
		prefix string
	}{{"direct", adm, "$JS.API"}, {"proxied", tenant, tenancy.JSAPIPrefix}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				name := "bench" + itoa(i)
				body := `{"stream_name":"FLEET_QUERIES","config":{"name":"` + name + `","deliver_policy":"all","ack_policy":"none","filter_subject":"fleet.query.acme.q1.>","replay_policy":"instant","inactive_threshold":60000000000,"num_replicas":1,"mem_storage":true},"action":"create"}`
				r, err := tc.nc.Request(tc.prefix+".CONSUMER.CREATE.FLEET_QUERIES."+name+".fleet.query.acme.q1.>", []byte(body), 10*time.Second)
				if err != nil || strings.Contains(string(r.Data), `"error"`) {
					b.Fatalf("%v %s", err, r.Data)
				}
				b.StopTimer()
				if err := admJS.DeleteConsumer(ctxT(b, 10*time.Second), "FLEET_QUERIES", name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
