package e2e

// The secure profile as one fleet (docs/tenancy.md, contained.md,
// gateway.md, http-api.md, webhooks.md together), started from outside
// by internal/securetest: the real nats-server on the configuration
// `dispatcher auth init` wrote, `dispatcher serve --http --auth-dir` with
// webhooks on dispatcher.creds, two workers on worker.creds, contained,
// with the model gateway and --warm 1. Two tenants drive it through every
// interface: /v1 with their tokens, NATS with their creds, the CLI, a
// webhook receiver and the dashboard.

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/securetest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// v1 is a /v1 client with one bearer token.
type v1 struct {
	t     *testing.T
	base  string
	token string
}

// do sends a request and returns the status and body.
func (c v1) do(method, path, body string, hdr ...string) (int, []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, strings.NewReader(body))
	require.NoError(c.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirects.Do(req)
	require.NoError(c.t, err, "%s %s: the server must answer, not hang", method, path)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, b
}

// noRedirects answers a redirect (the dashboard's to /login) as it is.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// errCode is an error body's code.
func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &e), "an error body: %s", b)
	require.NotEmpty(t, e.Error.Message, "%s", b)
	return e.Error.Code
}

// status is GET /v1/queries/{id}'s status.
func (c v1) status(id string) (int, protocol.StatusEvent) {
	c.t.Helper()
	code, b := c.do(http.MethodGet, "/v1/queries/"+id, "")
	var ev protocol.StatusEvent
	if code == http.StatusOK {
		require.NoError(c.t, json.Unmarshal(b, &ev), "%s", b)
	}
	return code, ev
}

// events reads GET …/events until the terminal status, returning the SSE
// events as "type id data" lines.
func (c v1) events(id string, hdr ...string) []sseEvent {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/queries/"+id+"/events", nil)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	require.Equal(c.t, http.StatusOK, resp.StatusCode)
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "event: "):
			cur.typ = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "id: "):
			cur.id = strings.TrimPrefix(l, "id: ")
		case strings.HasPrefix(l, "data: "):
			cur.data += strings.TrimPrefix(l, "data: ")
		case l == "" && cur.typ != "":
			out = append(out, cur)
			if cur.typ == "status" {
				var ev protocol.StatusEvent
				if json.Unmarshal([]byte(cur.data), &ev) == nil && ev.State.Terminal() {
					return out
				}
			}
			if cur.typ == "error" {
				return out
			}
			cur = sseEvent{}
		}
	}
	return out
}

type sseEvent struct{ typ, id, data string }

// waitTerminal polls GET /v1/queries/{id} until a terminal state. Polling
// an HTTP status is the interface under test here; each poll is one
// request.
func (c v1) waitTerminal(id string) protocol.StatusEvent {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		code, ev := c.status(id)
		if code == http.StatusOK && ev.State.Terminal() {
			return ev
		}
		require.True(c.t, time.Now().Before(deadline), "%s never ended (last %d %s)", id, code, ev.State)
		time.Sleep(100 * time.Millisecond) // polling the HTTP status is the interface under test
	}
}

// waitFor polls GET /v1/queries/{id} until ok(status).
func (c v1) waitFor(id, what string, ok func(protocol.StatusEvent) bool) protocol.StatusEvent {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		code, ev := c.status(id)
		if code == http.StatusOK && ok(ev) {
			return ev
		}
		require.True(c.t, time.Now().Before(deadline), "%s never %s (last %d %s)", id, what, code, ev.State)
		time.Sleep(100 * time.Millisecond) // polling the HTTP status is the interface under test
	}
}

func TestSecureProfile(t *testing.T) {
	t.Parallel()
	p := securetest.StartProfile(t, securetest.Options{})
	hooks := newHookReceiver(t)
	code, out, errs := p.RunNATS("tenant", "webhook", "add", "acme", hooks.srv.URL, "--events", "succeeded,cancelled",
		"--nats-creds", p.Creds(tenancy.AdminFile))
	require.Equal(t, 0, code, errs)
	hooks.secret = regexp.MustCompile(`whsec_[A-Za-z0-9+/=]+`).FindString(out + errs)
	require.NotEmpty(t, hooks.secret, out)

	acme := v1{t: t, base: p.HTTP, token: p.TenantToken("acme")}
	beta := v1{t: t, base: p.HTTP, token: p.TenantToken("beta")}
	at := func(t *testing.T) (v1, v1) { a, b := acme, beta; a.t, b.t = t, t; return a, b }

	t.Run("v1", func(t *testing.T) { secureV1(t, at) })
	t.Run("v1 sessions", func(t *testing.T) { secureV1Session(t, at) })
	t.Run("bad input", func(t *testing.T) { secureBadInput(t, p, at) })
	t.Run("webhooks", func(t *testing.T) { hooks.requireDelivered(t, "h1", "acme") })
	t.Run("dashboard", func(t *testing.T) { secureDashboard(t, at) })
	t.Run("nats", func(t *testing.T) { secureNATS(t, p) })
	t.Run("cli", func(t *testing.T) { secureCLI(t, p) })
	t.Run("revoke mid-run", func(t *testing.T) { secureRevoke(t, p, at) })
}

func secureV1(t *testing.T, at func(*testing.T) (v1, v1)) {
	acme, beta := at(t)
	code, b := acme.do(http.MethodPost, "/v1/queries", `{"id":"h1","prompt":"/standin lines=3"}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	code, b = beta.do(http.MethodPost, "/v1/queries", `{"id":"b1","prompt":"hello from beta"}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	ev := acme.waitTerminal("h1")
	require.Equal(t, protocol.StateSucceeded, ev.State)
	require.Equal(t, "acme", ev.Tenant)
	require.Equal(t, protocol.StateSucceeded, beta.waitTerminal("b1").State)

	// Events over SSE: every line, then the status; resumed after line 2.
	all := acme.events("h1")
	var ids []string
	for _, e := range all {
		if e.typ == "message" {
			ids = append(ids, e.id)
		}
	}
	require.GreaterOrEqual(t, len(ids), 4, "%v", all)
	require.Equal(t, "1", ids[0])
	resumed := acme.events("h1", "Last-Event-ID", "2")
	require.Equal(t, "message", resumed[0].typ, "%v", resumed)
	require.Equal(t, "3", resumed[0].id, "resumed after Last-Event-ID")

	// List: each tenant sees its own only.
	code, b = acme.do(http.MethodGet, "/v1/queries", "")
	require.Equal(t, http.StatusOK, code, "%s", b)
	require.Contains(t, string(b), `"h1"`)
	require.NotContains(t, string(b), `"b1"`)
	code, b = beta.do(http.MethodGet, "/v1/queries", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(b), `"b1"`)
	require.NotContains(t, string(b), `"h1"`)

	// Cancel a long one.
	code, b = acme.do(http.MethodPost, "/v1/queries", `{"id":"h2","prompt":"/standin sleep=10m"}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	acme.waitFor("h2", "running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
	code, b = acme.do(http.MethodPost, "/v1/queries/h2/cancel", "")
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	require.Equal(t, protocol.StateCancelled, acme.waitTerminal("h2").State)
	code, b = acme.do(http.MethodPost, "/v1/queries/h2/cancel", "")
	require.Equal(t, http.StatusConflict, code, "%s", b)
	require.Equal(t, "already_finished", errCode(t, b))

	// No workspace: no diff.
	code, b = acme.do(http.MethodGet, "/v1/queries/h1/diff", "")
	require.Equal(t, http.StatusNotFound, code, "%s", b)
	require.Equal(t, "not_found", errCode(t, b))
}

func secureV1Session(t *testing.T, at func(*testing.T) (v1, v1)) {
	acme, _ := at(t)
	code, b := acme.do(http.MethodPost, "/v1/queries", `{"id":"s1","prompt":"/standin ask=Bash","session":{"approvals":"remote"}}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	ev := acme.waitFor("s1", "awaiting approval", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateAwaitingApproval })
	require.NotEmpty(t, ev.RequestID)
	code, b = acme.do(http.MethodPost, "/v1/queries/s1/approvals/"+ev.RequestID, `{"allow":true}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	acme.waitFor("s1", "idle after turn 1", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateIdle && ev.Turn >= 1 })
	code, b = acme.do(http.MethodPost, "/v1/queries/s1/input", `{"text":"second turn"}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	acme.waitFor("s1", "idle after turn 2", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateIdle && ev.Turn >= 2 })
	code, b = acme.do(http.MethodPost, "/v1/queries/s1/end", "")
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	require.Equal(t, protocol.StateSucceeded, acme.waitTerminal("s1").State)
}

func secureBadInput(t *testing.T, p *securetest.Profile, at func(*testing.T) (v1, v1)) {
	acme, beta := at(t)
	// Another tenant's query does not exist for beta, whatever the call.
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/queries/h1", ""},
		{http.MethodGet, "/v1/queries/h1/events", ""},
		{http.MethodGet, "/v1/queries/h1/diff", ""},
		{http.MethodPost, "/v1/queries/h1/cancel", ""},
		{http.MethodPost, "/v1/queries/s1/input", `{"text":"x"}`},
		{http.MethodPost, "/v1/queries/s1/end", ""},
		{http.MethodGet, "/v1/queries/h1?tenant=acme", ""},
	} {
		code, b := beta.do(c.method, c.path, c.body)
		require.Equal(t, http.StatusNotFound, code, "%s %s: %s", c.method, c.path, b)
		require.Equal(t, "not_found", errCode(t, b))
	}
	code, b := beta.do(http.MethodGet, "/v1/queries?tenant=acme", "")
	require.Equal(t, http.StatusForbidden, code, "%s", b)
	// A body naming another tenant: refused, nothing enqueued.
	code, b = beta.do(http.MethodPost, "/v1/queries", `{"id":"evil-x","tenant":"acme","prompt":"hi"}`)
	require.Equal(t, http.StatusForbidden, code, "%s", b)
	require.Equal(t, "forbidden", errCode(t, b))
	// Bad tokens.
	for _, tok := range []string{"", "nope", acme.token + "x"} {
		c := v1{t: t, base: p.HTTP, token: tok}
		code, b = c.do(http.MethodGet, "/v1/queries", "")
		require.Equal(t, http.StatusUnauthorized, code, "token %q: %s", tok, b)
		require.Equal(t, "unauthorized", errCode(t, b))
	}
	// Ids that are not one subject token: refused as invalid jobs.
	for _, id := range []string{"evil/1", "../evil2", "..", "evil\u00013", "evil.4", "evil 5"} {
		body, _ := json.Marshal(map[string]string{"id": id, "prompt": "hi"})
		code, b = acme.do(http.MethodPost, "/v1/queries", string(body))
		require.Equal(t, http.StatusBadRequest, code, "id %q: %s", id, b)
		require.Equal(t, "invalid_job", errCode(t, b), "id %q", id)
	}
	for _, path := range []string{"/v1/queries/evil%2F1", "/v1/queries/..%2Fevil2", "/v1/queries/evil%013"} {
		code, b = acme.do(http.MethodGet, path, "")
		require.Equal(t, http.StatusNotFound, code, "%s: %s", path, b)
	}
	// Nothing was enqueued: the operator sees no such query anywhere.
	op := v1{t: t, base: p.HTTP, token: p.OperatorToken}
	for _, tenant := range []string{"acme", "beta"} {
		code, b = op.do(http.MethodGet, "/v1/queries?tenant="+tenant, "")
		require.Equal(t, http.StatusOK, code, "%s", b)
		require.NotContains(t, string(b), "evil", tenant)
	}
	// Nothing stored outside a tenant's prefix.
	root := filepath.Join(p.Root, "data")
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(root, path)
		require.NotContains(t, rel, "evil")
		require.NotContains(t, rel, "..")
		return nil
	}))
}

func secureDashboard(t *testing.T, at func(*testing.T) (v1, v1)) {
	acme, beta := at(t)
	code, b := acme.do(http.MethodGet, "/", "")
	require.Contains(t, []int{http.StatusOK, http.StatusSeeOther, http.StatusFound}, code, "%s", b)
	code, b = acme.do(http.MethodGet, "/queries", "")
	require.Equal(t, http.StatusOK, code, "%s", b)
	require.Contains(t, string(b), "/q/acme/h1")
	require.NotContains(t, string(b), "/q/beta/")
	code, _ = beta.do(http.MethodGet, "/q/acme/h1", "")
	require.Equal(t, http.StatusNotFound, code)
	code, b = (v1{t: t, base: acme.base, token: "nope"}).do(http.MethodGet, "/queries", "")
	require.NotEqual(t, http.StatusOK, code, "a wrong token reaches no page")
	require.NotContains(t, string(b), "/q/acme/")
}

// hookReceiver is a webhook endpoint that verifies each delivery's
// signature (Standard Webhooks) with the secret it was registered with.
type hookReceiver struct {
	srv    *httptest.Server
	secret string
	mu     sync.Mutex
	got    []hookDelivery
	bad    []string
	ch     chan struct{}
}

type hookDelivery struct {
	Type string               `json:"type"`
	Data protocol.StatusEvent `json:"data"`
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{ch: make(chan struct{}, 64)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := verifyHook(h.secret, r.Header, body); err != nil {
			h.bad = append(h.bad, err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var d hookDelivery
		if err := json.Unmarshal(body, &d); err != nil {
			h.bad = append(h.bad, err.Error())
		}
		h.got = append(h.got, d)
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func verifyHook(secret string, hdr http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(hdr.Get("webhook-id") + "." + hdr.Get("webhook-timestamp") + "."))
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(hdr.Get("webhook-signature")) {
		if sig == "v1,"+want {
			return nil
		}
	}
	return errors.New("bad signature: " + hdr.Get("webhook-signature"))
}

// requireDelivered waits for a signed delivery of tenant's id.
func (h *hookReceiver) requireDelivered(t *testing.T, id, tenant string) {
	timeout := time.After(wait)
	for {
		h.mu.Lock()
		require.Empty(t, h.bad, "deliveries that did not verify")
		for _, d := range h.got {
			require.Equal(t, tenant, d.Data.Tenant, "only %s's events reach its endpoint", tenant)
			if d.Data.ID == id {
				require.Equal(t, "query.succeeded", d.Type)
				h.mu.Unlock()
				return
			}
		}
		h.mu.Unlock()
		select {
		case <-h.ch:
		case <-timeout:
			t.Fatalf("no signed delivery of %s/%s", tenant, id)
		}
	}
}

// tenantConn connects with a tenant's creds as a tenant's client does.
func tenantConn(t *testing.T, p *securetest.Profile, tenant, creds string, opts ...nats.Option) *nats.Conn {
	opts = append(opts, nats.CustomInboxPrefix(tenancy.InboxPrefix(tenant)))
	nc, err := p.Connect(creds, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func secureNATS(t *testing.T, p *securetest.Profile) {
	errs := make(chan error, 64)
	nc := tenantConn(t, p, "acme", p.TenantCreds("acme"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	names := protocol.NewNames("")
	c, err := fleetapi.NewTenantClient(nc, names, tenancy.JSAPIPrefix)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// Live: a plain subscription on its own subjects.
	live := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe("fleet.query.acme.n1.>", live)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, nc.Flush())

	rep, err := c.Submit(ctx, protocol.Job{ID: "n1", Prompt: "/standin lines=40"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	require.Equal(t, "acme", rep.Tenant)
	for done := false; !done; {
		select {
		case m := <-live:
			if m.Subject == names.QueryStatus("acme", "n1") {
				var ev protocol.StatusEvent
				require.NoError(t, json.Unmarshal(m.Data, &ev))
				done = ev.State.Terminal()
			}
		case <-ctx.Done():
			t.Fatal("no live terminal status of n1")
		}
	}
	// Replay by ordered consumer through the tenant's API prefix: whole
	// and in order.
	var seqs []uint64
	final, err := c.Follow(ctx, "acme", "n1", true, fleetapi.Follower{Line: func(l fleetapi.Line) { seqs = append(seqs, l.Seq) }})
	// (These replay assertions need the tenant JetStream proxy's
	// ordered-consumer fix; they do not stop the subtest.)
	if assert.NoError(t, err, "replay by ordered consumer") {
		assert.Equal(t, protocol.StateSucceeded, final.State)
	}
	assert.GreaterOrEqual(t, len(seqs), 42, "the whole run replayed")
	for i, s := range seqs {
		assert.Equal(t, uint64(i+1), s, "replayed in order, none missing")
	}
	// Direct get of its own last status.
	legacy, err := nc.JetStream(nats.APIPrefix(tenancy.JSAPIPrefix))
	require.NoError(t, err)
	m, err := legacy.GetLastMsg(names.QueriesStream(), names.QueryStatus("acme", "n1"), nats.DirectGet())
	require.NoError(t, err, "direct get")
	require.Contains(t, string(m.Data), `"succeeded"`)

	// Cancel through .ctl, published by the tenant.
	rep, err = c.Submit(ctx, protocol.Job{ID: "n2", Prompt: "/standin sleep=10m"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	waitNATSState(t, c, "n2", protocol.StateRunning)
	r, err := c.Cancel(ctx, protocol.QueryRef{ID: "n2"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	final, err = c.Follow(ctx, "acme", "n2", true, fleetapi.Follower{})
	require.NoError(t, err)
	require.Equal(t, protocol.StateCancelled, final.State)

	// A session: approval, then an input, then the end.
	rep, err = c.Submit(ctx, protocol.Job{ID: "ns1", Prompt: "/standin ask=Bash", Session: &protocol.Session{Approvals: protocol.ApprovalsRemote}})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	ev := waitNATSState(t, c, "ns1", protocol.StateAwaitingApproval)
	allow := true
	r, err = c.SessionOp(ctx, protocol.OpApprove, protocol.SessionOpRequest{ID: "ns1", SessionOp: protocol.SessionOp{RequestID: ev.RequestID, Allow: &allow}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	waitNATSState(t, c, "ns1", protocol.StateIdle)
	r, err = c.SessionOp(ctx, protocol.OpInput, protocol.SessionOpRequest{ID: "ns1", SessionOp: protocol.SessionOp{Text: "again"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	r, err = c.SessionOp(ctx, protocol.OpEnd, protocol.SessionOpRequest{ID: "ns1"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	final, err = c.Follow(ctx, "acme", "ns1", true, fleetapi.Follower{})
	require.NoError(t, err)
	require.Equal(t, protocol.StateSucceeded, final.State)
	require.GreaterOrEqual(t, final.Turn, 2)

	// Another tenant's: not found, not reachable, not submittable.
	st, err := c.Status(ctx, protocol.QueryRef{ID: "b1"})
	require.NoError(t, err)
	require.NotNil(t, st.Error)
	require.Equal(t, protocol.CodeNotFound, st.Error.Code)
	rep, err = c.Submit(ctx, protocol.Job{ID: "evil-n", Tenant: "beta", Prompt: "hi"})
	require.NoError(t, err)
	require.NotNil(t, rep.Error, "a body naming another tenant is refused")
	for _, id := range []string{"evil/1", "../evil2", "evil\u00013", "evil.4"} {
		rep, err = c.Submit(ctx, protocol.Job{ID: id, Prompt: "hi"})
		require.NoError(t, err)
		require.NotNil(t, rep.Error, "id %q", id)
		require.Equal(t, protocol.CodeInvalidJob, rep.Error.Code, "id %q", id)
		st, err = c.Status(ctx, protocol.QueryRef{ID: id})
		require.NoError(t, err)
		require.NotNil(t, st.Error, "id %q", id)
	}
	_, err = nc.Subscribe("fleet.query.beta.>", func(*nats.Msg) {})
	require.NoError(t, err)
	require.NoError(t, nc.Publish("fleet.jobs.beta", []byte(`{"id":"evil-n2","prompt":"hi"}`)))
	require.NoError(t, nc.Flush())
	var refused []string
	for len(refused) < 2 {
		select {
		case err := <-errs:
			refused = append(refused, err.Error())
		case <-ctx.Done():
			t.Fatalf("NATS did not refuse another tenant's subjects: %v", refused)
		}
	}
	require.Contains(t, strings.Join(refused, "\n"), "fleet.query.beta.>")
	require.Contains(t, strings.Join(refused, "\n"), "fleet.jobs.beta")
}

// waitNATSState follows a query live until it reaches state.
func waitNATSState(t *testing.T, c *fleetapi.Client, id string, state protocol.State) protocol.StatusEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	got := make(chan protocol.StatusEvent, 1)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { stop(); <-done }()
	go func() {
		defer close(done)
		_, _ = c.Follow(fctx, "acme", id, true, fleetapi.Follower{Status: func(ev protocol.StatusEvent) {
			if ev.State == state {
				select {
				case got <- ev:
				default:
				}
				stop()
			}
		}})
	}()
	select {
	case ev := <-got:
		return ev
	case <-ctx.Done():
		t.Fatalf("%s never %s", id, state)
		return protocol.StatusEvent{}
	}
}

func secureCLI(t *testing.T, p *securetest.Profile) {
	creds := p.TenantCreds("acme")
	cli := func(args ...string) (int, string, string) {
		return p.RunNATS(append(args, "--nats-creds", creds)...)
	}
	code, out, errs := cli("submit", "--id", "c1", "--follow", "/standin lines=2")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Contains(t, out, "[status] succeeded")
	code, out, errs = cli("status", "c1")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Contains(t, out, `"state": "succeeded"`)
	require.Contains(t, out, `"tenant": "acme"`)
	code, out, errs = cli("ls")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	require.Contains(t, out, "c1")
	require.NotRegexp(t, `(?m)^beta\s|\sb1\s`, out, "beta's query is not in acme's list")
	code, out, errs = cli("tail", "c1", "--raw")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	// The run's lines byte for byte: the two scripted lines, and a result
	// last (a warm agent also echoes the prompt and answers it).
	require.Equal(t, 2, strings.Count(out, `"text":"line `), out)
	raw := strings.Split(strings.TrimSpace(out), "\n")
	require.True(t, protocol.ParseMessage([]byte(raw[len(raw)-1])).IsResult(), out)
	code, _, errs = cli("submit", "--id", "c2", "/standin sleep=10m")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	code, _, errs = cli("cancel", "c2")
	require.Equal(t, fleetcli.ExitOK, code, errs)
	code, _, errs = cli("tail", "c2")
	require.Equal(t, fleetcli.ExitCancelled, code, errs)
	// Another tenant's query and tenant: not found, refused.
	code, _, _ = cli("status", "b1")
	require.Equal(t, fleetcli.ExitNotFound, code)
	code, _, _ = cli("status", "b1", "--tenant", "beta")
	require.Equal(t, fleetcli.ExitUsage, code)
}

// A tenant revoked while its job runs: its NATS clients are cut and its
// token is refused, its running job still finishes, and the other tenant
// goes on.
func secureRevoke(t *testing.T, p *securetest.Profile, at func(*testing.T) (v1, v1)) {
	acme, beta := at(t)
	closed := make(chan struct{})
	creds := p.TenantCreds("acme")
	nc := tenantConn(t, p, "acme", creds, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	c, err := fleetapi.NewTenantClient(nc, protocol.NewNames(""), tenancy.JSAPIPrefix)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rep, err := c.Submit(ctx, protocol.Job{ID: "rv1", Prompt: "/standin lines=20 delay=100ms"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	waitNATSState(t, c, "rv1", protocol.StateRunning)

	code, _, errs := p.RunNATS("tenant", "revoke", "acme", "--dir", p.Auth)
	require.Equal(t, 0, code, errs)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the revoked tenant's connection was not cut")
	}
	code, b := acme.do(http.MethodGet, "/v1/queries/rv1", "")
	require.Equal(t, http.StatusUnauthorized, code, "%s", b)
	if nc2, err := p.Connect(creds); err == nil {
		nc2.Close()
		t.Fatal("the revoked tenant's creds still connect")
	}

	op := v1{t: t, base: p.HTTP, token: p.OperatorToken}
	ev := op.waitFor("rv1?tenant=acme", "ended", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, protocol.StateSucceeded, ev.State, "the revoked tenant's running job finishes")

	code, b = beta.do(http.MethodPost, "/v1/queries", `{"id":"b2","prompt":"after the revoke"}`)
	require.Equal(t, http.StatusAccepted, code, "%s", b)
	require.Equal(t, protocol.StateSucceeded, beta.waitTerminal("b2").State)
}
