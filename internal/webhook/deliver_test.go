package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

const wait = 2 * time.Minute

// hit is one request a receiver got.
type hit struct {
	ID, Type, Query string
	Answer          int
}

// receiver is a webhook endpoint: it verifies every request's signature
// and answers what answer says (called with how often it saw the
// webhook-id, 1 first); answer may block.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	answer func(r *http.Request, n int) int

	mu      sync.Mutex
	secret  string
	hits    []hit
	seen    map[string]int
	open    int
	maxOpen int
	changed chan struct{}
}

func newReceiver(t *testing.T, answer func(r *http.Request, n int) int) *receiver {
	rc := &receiver{t: t, answer: answer, seen: map[string]int{}, changed: make(chan struct{}, 1)}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	require.NoError(rc.t, err)
	rc.mu.Lock()
	secret := rc.secret
	rc.open++
	rc.maxOpen = max(rc.maxOpen, rc.open)
	rc.mu.Unlock()
	if err := verify(secret, r.Header, body); err != nil {
		rc.t.Errorf("a delivery's signature does not verify: %v", err)
	}
	var p webhook.Payload
	if err := json.Unmarshal(body, &p); err != nil {
		rc.t.Errorf("a delivery's body is not a payload: %v", err)
	}
	id := r.Header.Get("webhook-id")
	rc.mu.Lock()
	rc.seen[id]++
	n := rc.seen[id]
	rc.mu.Unlock()
	code := rc.answer(r, n)
	rc.mu.Lock()
	rc.open--
	rc.hits = append(rc.hits, hit{ID: id, Type: p.Type, Query: p.Data.ID, Answer: code})
	rc.mu.Unlock()
	select {
	case rc.changed <- struct{}{}:
	default:
	}
	w.WriteHeader(code)
}

// waitFor waits until cond holds of the hits so far.
func (rc *receiver) waitFor(what string, cond func([]hit) bool) []hit {
	rc.t.Helper()
	deadline := time.After(wait)
	for {
		rc.mu.Lock()
		hits := append([]hit(nil), rc.hits...)
		rc.mu.Unlock()
		if cond(hits) {
			return hits
		}
		select {
		case <-rc.changed:
		case <-deadline:
			rc.t.Fatalf("timed out waiting for %s; hits: %+v", what, hits)
		}
	}
}

func delivered(hits []hit, typ, query string) bool {
	for _, h := range hits {
		if h.Type == typ && h.Query == query && h.Answer == http.StatusOK {
			return true
		}
	}
	return false
}

type fixture struct {
	f   *fleettest.Fleet
	svc *webhook.Service
}

func newFixture(t *testing.T, slots int, mod func(*webhook.Config)) *fixture {
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 64})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: slots})
	fleettest.WaitReady(t, w.W)
	cfg := webhook.Config{NC: f.NC, Names: f.Names, Backoff: 20 * time.Millisecond, AllowPrivate: true,
		Timeout: 500 * time.Millisecond, Sweep: 100 * time.Millisecond, InFlight: 2, Logger: &f.Logger}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := webhook.New(cfg)
	require.NoError(t, err)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, svc.Stop(ctx))
	})
	return &fixture{f: f, svc: svc}
}

func (fx *fixture) call(t *testing.T, op string, req webhook.Request) webhook.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := webhook.Call(ctx, fx.f.NC, fx.f.Names, op, req)
	require.NoError(t, err)
	return rep
}

func (fx *fixture) add(t *testing.T, tenant string, rc *receiver, url string, events ...string) webhook.Endpoint {
	t.Helper()
	rep := fx.call(t, webhook.OpAdd, webhook.Request{Tenant: tenant, URL: url, Events: events})
	require.Nil(t, rep.Error)
	require.Regexp(t, `^whsec_`, rep.Endpoint.Secret)
	rc.mu.Lock()
	rc.secret = rep.Endpoint.Secret
	rc.mu.Unlock()
	return *rep.Endpoint
}

func (fx *fixture) deliveries(t *testing.T, tenant, endpoint string) []webhook.Delivery {
	t.Helper()
	rep := fx.call(t, webhook.OpDeliveries, webhook.Request{Tenant: tenant, Endpoint: endpoint})
	require.Nil(t, rep.Error)
	return rep.Deliveries
}

// TestReceiversThatFailDelayAndComeBack: a receiver that fails, one that
// hangs past the timeout, and one that goes down and comes back each get
// their deliveries in the end, with the same webhook-id on every attempt,
// every attempt recorded, every signature verified.
func TestReceiversThatFailDelayAndComeBack(t *testing.T) {
	fx := newFixture(t, 4, nil)

	t.Run("fails twice", func(t *testing.T) {
		rc := newReceiver(t, func(_ *http.Request, n int) int {
			if n <= 2 {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		ep := fx.add(t, "flaky", rc, rc.srv.URL+"/hook", "succeeded")
		fx.f.SubmitJSON("flaky", "f1", "hi")
		hits := rc.waitFor("f1 delivered", func(h []hit) bool { return delivered(h, "query.succeeded", "f1") })
		require.Len(t, hits, 3, "two failures, then the delivery: %+v", hits)
		for _, h := range hits {
			require.Equal(t, hits[0].ID, h.ID, "the same webhook-id on every retry")
		}
		// The attempt is recorded once the receiver's answer is back.
		fleettest.Eventually(t, wait, func() bool {
			ds := fx.deliveries(t, "flaky", ep.ID)
			return len(ds) == 1 && ds[0].Done
		}, "the delivery recorded as done")
		ds := fx.deliveries(t, "flaky", ep.ID)
		require.Equal(t, hits[0].ID, ds[0].WebhookID)
		require.Len(t, ds[0].Attempts, 3)
		require.Equal(t, []int{500, 500, 200}, []int{ds[0].Attempts[0].Status, ds[0].Attempts[1].Status, ds[0].Attempts[2].Status})
		require.Equal(t, "HTTP 500", ds[0].Attempts[0].Error)
	})

	t.Run("hangs past the timeout", func(t *testing.T) {
		rc := newReceiver(t, func(r *http.Request, n int) int {
			if n == 1 {
				<-r.Context().Done() // until the sender gives up on it
			}
			return http.StatusOK
		})
		ep := fx.add(t, "slow", rc, rc.srv.URL, "succeeded")
		fx.f.SubmitJSON("slow", "s1", "hi")
		rc.waitFor("s1 delivered", func(h []hit) bool { return delivered(h, "query.succeeded", "s1") })
		fleettest.Eventually(t, wait, func() bool {
			ds := fx.deliveries(t, "slow", ep.ID)
			return len(ds) == 1 && ds[0].Done
		}, "the delivery recorded as done")
		ds := fx.deliveries(t, "slow", ep.ID)
		require.Equal(t, "timed out", ds[0].Attempts[0].Error)
		require.Equal(t, 200, ds[0].Attempts[len(ds[0].Attempts)-1].Status)
	})

	t.Run("goes down and comes back", func(t *testing.T) {
		rc := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
		addr := rc.srv.Listener.Addr().String()
		ep := fx.add(t, "down", rc, rc.srv.URL, "succeeded", "failed")
		rc.srv.Close()
		fx.f.SubmitJSON("down", "d1", "/standin error=1")
		fleettest.Eventually(t, wait, func() bool {
			ds := fx.deliveries(t, "down", ep.ID)
			return len(ds) == 1 && len(ds[0].Attempts) >= 2
		}, "attempts failing while the receiver is down")
		ds := fx.deliveries(t, "down", ep.ID)
		require.Equal(t, 0, ds[0].Attempts[0].Status)
		require.Contains(t, ds[0].Attempts[0].Error, "refused")
		require.False(t, ds[0].NextRetry.IsZero(), "a next retry is planned")
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		back := &http.Server{Handler: http.HandlerFunc(rc.serve), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = back.Serve(ln) }()
		t.Cleanup(func() { _ = back.Close() })
		hits := rc.waitFor("d1 delivered", func(h []hit) bool { return delivered(h, "query.failed", "d1") })
		require.Len(t, hits, 1, "one request reached the receiver, once it was back")
		require.Equal(t, ds[0].WebhookID, hits[0].ID)
	})

	t.Run("only the events asked for, only after add", func(t *testing.T) {
		fx.f.SubmitJSON("picky", "before", "hi")
		fx.f.Follow("picky", "before", wait)
		rc := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
		fx.add(t, "picky", rc, rc.srv.URL, "failed")
		fx.f.SubmitJSON("picky", "ok1", "hi")
		fx.f.Follow("picky", "ok1", wait)
		fx.f.SubmitJSON("picky", "bad1", "/standin error=1")
		hits := rc.waitFor("bad1 delivered", func(h []hit) bool { return delivered(h, "query.failed", "bad1") })
		// Status events are read in stream order: ok1's came first and
		// made no delivery.
		require.Len(t, hits, 1, "%+v", hits)
	})

	t.Run("ls and rm", func(t *testing.T) {
		rep := fx.call(t, webhook.OpList, webhook.Request{Tenant: "flaky"})
		require.Len(t, rep.Endpoints, 1)
		require.Empty(t, rep.Endpoints[0].Secret, "ls does not show secrets")
		rm := fx.call(t, webhook.OpRemove, webhook.Request{Tenant: "flaky", Endpoint: rep.Endpoints[0].ID})
		require.Nil(t, rm.Error)
		require.Empty(t, fx.call(t, webhook.OpList, webhook.Request{Tenant: "flaky"}).Endpoints)
		again := fx.call(t, webhook.OpRemove, webhook.Request{Tenant: "flaky", Endpoint: rep.Endpoints[0].ID})
		require.Equal(t, webhook.CodeNotFound, again.Error.Code)
		require.Empty(t, fx.call(t, webhook.OpList, webhook.Request{Tenant: "slow-other"}).Endpoints, "another tenant has none")
	})
}

// TestPrivateURLsRefusedAtAdd: without --webhook-allow-private, add
// refuses loopback receivers and names no endpoint.
func TestPrivateURLsRefusedAtAdd(t *testing.T) {
	fx := newFixture(t, 1, func(c *webhook.Config) { c.AllowPrivate = false })
	for _, u := range []string{"http://127.0.0.1:8080/hook", "http://169.254.169.254/", "ftp://example.com/"} {
		rep := fx.call(t, webhook.OpAdd, webhook.Request{Tenant: "t", URL: u})
		require.NotNil(t, rep.Error, u)
		require.Equal(t, webhook.CodeInvalid, rep.Error.Code)
	}
	rep := fx.call(t, webhook.OpAdd, webhook.Request{Tenant: "t", URL: "http://127.0.0.1/", Events: []string{"running"}})
	require.Contains(t, rep.Error.Message, "not one of")
	require.Empty(t, fx.call(t, webhook.OpList, webhook.Request{Tenant: "t"}).Endpoints)
}

// TestSlowReceiverDoesNotSlowTheFleet: a 200-job run with no webhook, then
// one with every request to the receiver blocked: both complete, every job
// ending, the second while the receiver has still answered nothing, with
// no more requests open at once than the bound; once it answers, each
// job's delivery arrives, signed, with one webhook-id per query.
func TestSlowReceiverDoesNotSlowTheFleet(t *testing.T) {
	const jobs = 200
	fx := newFixture(t, 8, func(c *webhook.Config) { c.Timeout = 10 * time.Minute; c.InFlight = 3 })
	without := fx.run(t, "plain", jobs)
	release := make(chan struct{})
	rc := newReceiver(t, func(*http.Request, int) int {
		<-release
		return http.StatusOK
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	fx.add(t, "bulk", rc, rc.srv.URL, "succeeded")
	with := fx.run(t, "bulk", jobs)
	rc.mu.Lock()
	answered, open, maxOpen := len(rc.hits), rc.open, rc.maxOpen
	rc.mu.Unlock()
	require.Equal(t, without, with, "as many jobs ended with the blocked receiver as without a webhook")
	require.Zero(t, answered, "the run completed while the receiver had answered nothing")
	require.Positive(t, open, "the receiver was holding requests while the run completed")
	require.LessOrEqual(t, maxOpen, 3, "no more requests open at once than the in-flight bound")
	close(release)
	hits := rc.waitFor("every job's delivery", func(h []hit) bool {
		got := map[string]bool{}
		for _, x := range h {
			if x.Type == "query.succeeded" && x.Answer == http.StatusOK {
				got[x.Query] = true
			}
		}
		return len(got) == jobs
	})
	ids := map[string]string{}
	for _, h := range hits {
		if prev, ok := ids[h.Query]; ok {
			require.Equal(t, prev, h.ID, "a query's deliveries share one webhook-id")
		}
		ids[h.Query] = h.ID
	}
	require.Len(t, ids, jobs)
}

// run submits n jobs for tenant and waits until each has ended; it
// returns how many ended.
func (fx *fixture) run(t *testing.T, tenant string, n int) int {
	t.Helper()
	var mu sync.Mutex
	ended := map[string]bool{}
	all := make(chan struct{})
	var once sync.Once
	sub, err := fx.f.NC.Subscribe(fx.f.Names.QueryStatus(tenant, "*"), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) != nil || !ev.State.Terminal() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		ended[ev.ID] = true
		if len(ended) == n {
			once.Do(func() { close(all) })
		}
	})
	require.NoError(t, err)
	require.NoError(t, fx.f.NC.Flush())
	defer func() { _ = sub.Unsubscribe() }()
	for i := range n {
		fx.f.SubmitJSON(tenant, tenant+"-j"+fleettest.Itoa(i), "hi") // Nats-Msg-Id is the id alone: unique across tenants
	}
	select {
	case <-all:
	case <-time.After(5 * wait):
		t.Fatalf("a %d-job run of %s did not complete", n, tenant)
	}
	mu.Lock()
	defer mu.Unlock()
	return len(ended)
}

// TestNoEndpointsNoConsuming: while no endpoint exists the service reads no
// status event (the fleet's jobs cost the server no deliveries for it); the
// first endpoint starts the reading, and its events are delivered; with
// the last one removed, reading stops again.
func TestNoEndpointsNoConsuming(t *testing.T) {
	fx := newFixture(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cons, err := fx.f.JS.Consumer(ctx, fx.f.Names.QueriesStream(), webhook.ConsumerName)
	require.NoError(t, err)
	read := func() uint64 {
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.Delivered.Consumer
	}
	fx.f.SubmitJSON("quiet", "q1", "hi")
	fx.f.Follow("quiet", "q1", wait)
	require.Zero(t, read(), "status events read with no endpoint")

	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusOK })
	ep := fx.add(t, "quiet", rc, rc.srv.URL+"/hook", "succeeded")
	fx.f.SubmitJSON("quiet", "q2", "hi")
	hits := rc.waitFor("q2 delivered", func(h []hit) bool { return delivered(h, "query.succeeded", "q2") })
	for _, h := range hits {
		require.NotEqual(t, "q1", h.Query, "an event from before the endpoint was delivered")
	}

	require.Nil(t, fx.call(t, webhook.OpRemove, webhook.Request{Tenant: "quiet", Endpoint: ep.ID}).Error)
	fleettest.Eventually(t, wait, func() bool {
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.NumWaiting == 0
	}, "the service's pull requests gone")
	before := read()
	fx.f.SubmitJSON("quiet", "q3", "hi")
	fx.f.Follow("quiet", "q3", wait)
	require.Equal(t, before, read(), "status events read after the last endpoint was removed")
}
