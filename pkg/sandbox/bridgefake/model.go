package bridgefake

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/gateway"
)

// CredentialPlaceholder is what a process gets as ANTHROPIC_API_KEY when
// the fake meters model calls, as the Worker's placeholderEnv does: not a
// secret, the egress drops it and sends the fake Worker's key instead.
const CredentialPlaceholder = "agentfleet-egress-injected"

// modelEgress emulates the bridge Worker's metered egress for
// api.anthropic.com (deploy/cloudflare/src/model-gateway.ts) with the Go
// gateway's own meter, prices and caps: a loopback listener that processes
// reach as ANTHROPIC_BASE_URL=<url>/sb/<id>, which finds the sandbox's open
// run (401 without one), and forwards to an pkg/gateway.Gateway that
// holds the key, meters, and refuses with 402 past the cap. The key lives
// in the fake, never in a process's environment.
type modelEgress struct {
	gw  *gateway.Gateway
	srv *http.Server
	url string

	mu   sync.Mutex
	runs map[string]*modelRun // by sandbox id
	keys map[modelKey]*modelRun
}

type modelKey struct {
	tenant, query string
	attempt       int
}

// modelRun is one sandbox's open run.
type modelRun struct {
	open   openModelReq
	token  string
	events []gateway.Event
}

// openModelReq is the body of PUT /v1/sb/:id/model.
type openModelReq struct {
	Tenant     string   `json:"tenant"`
	QueryID    string   `json:"query_id"`
	Attempt    *int     `json:"attempt"`
	FirstCall  *int     `json:"first_call"`
	MaxCostUSD *float64 `json:"max_cost_usd"`
	SpentUSD   *float64 `json:"spent_usd"`
}

// modelReport is the answer of GET and DELETE /v1/sb/:id/model.
type modelReport struct {
	Events     []gateway.Event `json:"events"`
	Next       int             `json:"next"`
	SpentUSD   float64         `json:"spent_usd"`
	MaxCostUSD *float64        `json:"max_cost_usd,omitempty"`
	Capped     bool            `json:"capped"`
}

// startModelEgress starts the gateway (upstream: the test's fake API) and
// the egress listener; both stop at tb's cleanup.
//
// Without an upstream the routes still keep runs (a worker opens one for
// every run), but processes get no egress: they make no model calls.
func startModelEgress(tb testing.TB, upstream, key string) *modelEgress {
	tb.Helper()
	m := &modelEgress{runs: map[string]*modelRun{}, keys: map[modelKey]*modelRun{}}
	if upstream == "" {
		return m
	}
	gw, err := gateway.Start(gateway.Config{Upstream: upstream, APIKey: key, Publisher: gateway.PublisherFunc(m.record)})
	if err != nil {
		tb.Fatalf("bridgefake model egress: %v", err)
	}
	m.gw = gw
	gwURL, _ := url.Parse(gw.URL())
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(gwURL)
			r.Out.Header.Del("Authorization")
			r.Out.Header.Set("X-Api-Key", r.In.Header.Get("X-Fake-Run-Token"))
			r.Out.Header.Del("X-Fake-Run-Token")
		},
		FlushInterval: -1,
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/sb/")
		id, path, _ := strings.Cut(rest, "/")
		m.mu.Lock()
		run := m.runs[id]
		m.mu.Unlock()
		if !ok || run == nil {
			apiError(w, http.StatusUnauthorized, "authentication_error", "no run is open in this sandbox")
			return
		}
		r.URL.Path, r.URL.RawPath = "/"+path, ""
		r.Header.Del("X-Api-Key") // the placeholder: dropped, the run's own credential goes on
		r.Header.Set("X-Fake-Run-Token", run.token)
		proxy.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = gw.Stop(context.Background())
		tb.Fatalf("bridgefake model egress: %v", err)
	}
	m.srv = &http.Server{Handler: h}
	m.url = "http://" + ln.Addr().String()
	go func() { _ = m.srv.Serve(ln) }()
	tb.Cleanup(m.stop)
	return m
}

func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

func (m *modelEgress) stop() {
	if m.gw == nil {
		return
	}
	_ = m.srv.Close()
	m.mu.Lock()
	var tokens []string
	for _, r := range m.runs {
		tokens = append(tokens, r.token)
	}
	m.runs = map[string]*modelRun{}
	m.mu.Unlock()
	for _, t := range tokens {
		m.gw.Close(t)
	}
	_ = m.gw.Stop(context.Background())
}

// record is the gateway's Publisher: the call is kept on its run.
func (m *modelEgress) record(info gateway.RunInfo, ev gateway.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.keys[modelKey{info.Tenant, info.QueryID, info.Attempt}]; r != nil {
		r.events = append(r.events, ev)
	}
}

// env is what a process of sandbox id gets: the egress's URL and the placeholder.
func (m *modelEgress) env(id string) map[string]string {
	if m.gw == nil {
		return nil
	}
	return map[string]string{
		"ANTHROPIC_BASE_URL":                       m.url + "/sb/" + id,
		"ANTHROPIC_API_KEY":                        CredentialPlaceholder,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
	}
}

func checkOpen(req openModelReq) string {
	label := func(s string) bool {
		return s != "" && len(s) <= 256 && !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 })
	}
	dollars := func(p *float64, positive bool) bool {
		return p == nil || (!math.IsNaN(*p) && !math.IsInf(*p, 0) && *p >= 0 && (!positive || *p > 0))
	}
	switch {
	case !label(req.Tenant) || !label(req.QueryID):
		return "tenant and query_id must be non-empty strings"
	case req.Attempt == nil || *req.Attempt < 0 || req.FirstCall == nil || *req.FirstCall < 1:
		return "attempt must be an integer >= 0 and first_call >= 1"
	case !dollars(req.MaxCostUSD, true) || req.MaxCostUSD != nil && *req.MaxCostUSD > 1e9 || !dollars(req.SpentUSD, false):
		return "max_cost_usd must be > 0 and at most 1e9, spent_usd >= 0"
	}
	return ""
}

// FailModel makes the next n requests to the /model routes answer 503
// container_unavailable, as a bridge that cannot reach the sandbox's object.
func (f *Fake) FailModel(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failModel = n
}

// modelFault answers an injected 503, reporting whether it did.
func (f handlers) modelFault(w http.ResponseWriter) bool {
	f.mu.Lock()
	fail := f.failModel > 0
	if fail {
		f.failModel--
	}
	f.mu.Unlock()
	if fail {
		writeError(w, http.StatusServiceUnavailable, "container_unavailable", "injected failure")
	}
	return fail
}

func (f handlers) handleModelOpen(w http.ResponseWriter, r *http.Request) {
	m := f.model
	if f.modelFault(w) {
		return
	}
	var req openModelReq
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	if msg := checkOpen(req); msg != "" {
		writeError(w, http.StatusBadRequest, "invalid_model_run", msg)
		return
	}
	info := gateway.RunInfo{Tenant: req.Tenant, QueryID: req.QueryID, Attempt: *req.Attempt, FirstCall: *req.FirstCall}
	if req.MaxCostUSD != nil {
		info.MaxCostUSD = *req.MaxCostUSD
	}
	if req.SpentUSD != nil {
		info.SpentUSD = *req.SpentUSD
	}
	m.closeRun(r.PathValue("id"))
	run := &modelRun{open: req}
	if m.gw != nil {
		run.token, _ = m.gw.Open(info)
	}
	m.mu.Lock()
	m.runs[r.PathValue("id")] = run
	m.keys[modelKey{info.Tenant, info.QueryID, info.Attempt}] = run
	m.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"open": true})
}

// closeRun ends sandbox id's run, if any (its calls in flight finish first).
func (m *modelEgress) closeRun(id string) {
	m.mu.Lock()
	run := m.runs[id]
	delete(m.runs, id)
	m.mu.Unlock()
	if run == nil {
		return
	}
	if m.gw != nil {
		m.gw.Close(run.token)
	}
	m.mu.Lock()
	delete(m.keys, modelKey{run.open.Tenant, run.open.QueryID, *run.open.Attempt})
	m.mu.Unlock()
}

func (f handlers) handleModelReport(w http.ResponseWriter, r *http.Request) {
	m := f.model
	if f.modelFault(w) {
		return
	}
	from, err := strconv.Atoi(cmp.Or(r.URL.Query().Get("from"), "0"))
	if err != nil || from < 0 || from > 999_999_999 {
		writeError(w, http.StatusBadRequest, "invalid_offset", "from must be a non-negative integer")
		return
	}
	id := r.PathValue("id")
	m.mu.Lock()
	run := m.runs[id]
	var rep modelReport
	if run != nil {
		rep = run.report(from)
	}
	m.mu.Unlock()
	if run == nil {
		writeError(w, http.StatusNotFound, "model_run_not_found", "no model run is open in sandbox "+id)
		return
	}
	if r.Method == http.MethodDelete {
		m.closeRun(id)
		// Calls that finished while it closed are reported too.
		m.mu.Lock()
		rep = run.report(from)
		m.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, rep)
}

// report is r's state from cursor from on; the caller holds the lock.
func (r *modelRun) report(from int) modelReport {
	spent := 0.0
	if r.open.SpentUSD != nil {
		spent = *r.open.SpentUSD
	}
	for _, ev := range r.events {
		spent += ev.CostUSD
	}
	rep := modelReport{Events: []gateway.Event{}, Next: max(from, len(r.events)), SpentUSD: spent, MaxCostUSD: r.open.MaxCostUSD}
	if from < len(r.events) {
		rep.Events = append(rep.Events, r.events[from:]...)
	}
	rep.Capped = r.open.MaxCostUSD != nil && spent >= *r.open.MaxCostUSD
	return rep
}
