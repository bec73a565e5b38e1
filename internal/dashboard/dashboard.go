// Package dashboard is the fleet's web UI, served by `dispatcher serve
// --http ADDR` at /: server-rendered pages from Go templates (embedded),
// and a few hundred lines of plain JavaScript (embedded, no build step)
// that render a query's transcript live from Server-Sent Events.
//
// # Pages
//
//   - / : the fleet: workers (state, slots, running jobs), the queue per
//     tenant (depth, oldest wait, spend), desired workers, recent failures
//     with their reasons, and charts (charts.go, fleet.js with uPlot
//     vendored under web/vendor/uplot): jobs ended and failed per minute,
//     queue depth and oldest wait per tenant over time, spend per tenant.
//     The page polls /fleet.json every 2 s and redraws in place.
//   - /fleet.json : what the fleet page draws (charts.go), the operator's.
//   - /queries?tenant=&state=&q=&cursor= : pages of the status index
//     (httpapi.ListIndex, as GET /v1/queries) with filters and search by
//     id, metadata and error (httpapi.Matches); without Config.Status, the
//     latest queries the dispatcher lists.
//   - /q/<tenant>/<id> : one query: its status timeline and transcript
//     (text, tool calls and results, cost) growing live, its workspace
//     changes when it has any, a cancel button, and for sessions an input
//     box and approve/deny buttons.
//   - /q/<tenant>/<id>/events : the SSE feed the query page reads: every
//     line, model call (.model) and status event from the query's first
//     message on; the page draws the run's timeline from it (runline.js).
//
// # Access
//
// With a token (dispatcher serve --ui-token), a request needs it as
// "Authorization: Bearer <token>" or the cookie /login sets. Tenant tokens
// (docs/tenancy.md, Config.Tenants) are taken the same ways and reach only their
// tenant's queries (tenants.go). Without either, only loopback clients are
// served. A refused request is sent to /login only when it is a browser's
// (a GET accepting HTML, with no Authorization header); any other gets
// 401 with the HTTP API's JSON error, so a program with a wrong token
// hears so. State-changing requests are POSTs whose Origin (when sent)
// must be this host.
package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/internal/httpapi"
	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

//go:embed web
var web embed.FS

// searchRecords is how many of the latest records a search reads.
const searchRecords = 1000

// cookieName holds the token after /login.
const cookieName = "fleet_ui_token"

// Config configures the dashboard.
type Config struct {
	// Client talks to the fleet. Required.
	Client *fleetapi.Client
	// Queue reads the queue per tenant and the workers. Required.
	Queue *fleetmetrics.Collector
	// Token, when set, is required of every request; else only loopback
	// clients are served.
	Token string
	// Tenants, when set, verifies a tenant's bearer token and returns its
	// tenant (tenancy.Dir.VerifyToken, dispatcher serve --auth-dir); such a
	// token reaches only that tenant's queries. Set, it ends loopback's
	// open access as Token does.
	Tenants func(token string) (tenant string, err error)
	// Objects is the fleet's storage, where workspace diffs are; when nil
	// the query page shows a workspace's changed files but not its diff.
	Objects storage.Store
	// Status is the status store; when set, the query list pages its index
	// (httpapi.ListIndex, as GET /v1/queries), else it shows the latest
	// queries the dispatcher lists.
	Status storage.Store
	// PageSize is the query list's page size (default DefaultPageSize).
	PageSize int
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// DefaultPageSize is the query list's default page size.
const DefaultPageSize = 50

// Handler serves the dashboard.
type Handler struct {
	cfg  Config
	log  zerolog.Logger
	tmpl *template.Template
	mux  *http.ServeMux
}

// New returns the dashboard's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Client == nil || cfg.Queue == nil {
		return nil, errors.New("dashboard: Client and Queue are required")
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	tmpl, err := template.New("").Funcs(template.FuncMap{
		"ago":  func(t time.Time) string { return time.Since(t).Truncate(time.Second).String() },
		"secs": func(d time.Duration) string { return d.Truncate(time.Second).String() },
		"cost": func(r *protocol.ResultSummary) string {
			if r == nil {
				return "-"
			}
			return fmt.Sprintf("$%.4f", r.TotalCostUSD)
		},
		"path": url.PathEscape,
		"dur": func(r *protocol.ResultSummary) string {
			if r == nil || r.DurationMS == 0 {
				return "-"
			}
			return (time.Duration(r.DurationMS) * time.Millisecond).Round(100 * time.Millisecond).String()
		},
		"until": func(t time.Time) string {
			if d := time.Until(t); d > 0 {
				return "in " + d.Truncate(time.Second).String()
			}
			return "due"
		},
		"last": func(as []webhook.Attempt) webhook.Attempt { return as[len(as)-1] },
	}).ParseFS(web, "web/*.html")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, log: cfg.Logger.With().Str("component", "dashboard").Logger(), tmpl: tmpl, mux: http.NewServeMux()}
	static, _ := fs.Sub(web, "web")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /login", h.loginPage)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("GET /{$}", h.fleet)
	h.mux.HandleFunc("GET /fleet.json", h.fleetJSON)
	h.mux.HandleFunc("GET /queries", h.queries)
	h.mux.HandleFunc("GET /q/{tenant}/{id}", h.query)
	h.mux.HandleFunc("GET /q/{tenant}/{id}/events", h.events)
	h.mux.HandleFunc("GET /q/{tenant}/{id}/diff", h.diff)
	h.mux.HandleFunc("POST /q/{tenant}/{id}/cancel", h.cancel)
	h.mux.HandleFunc("POST /q/{tenant}/{id}/input", h.sessionOp)
	h.mux.HandleFunc("POST /q/{tenant}/{id}/approve", h.sessionOp)
	return h, nil
}

// ServeHTTP checks access, then serves.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	open := r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/")
	tenant, ok := h.access(r)
	if !open && !ok {
		// Only a browser that sent no credentials is sent to sign in; a
		// program (an Authorization header, right or wrong, or no taste
		// for HTML) gets the API's 401.
		if h.tokens() && !strings.HasSuffix(r.URL.Path, "/events") && httpapi.SignInFits(r) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		msg := "the dashboard needs a token: Authorization: Bearer <token> (--ui-token, or a tenant's)"
		if !h.tokens() {
			msg = "no token is configured, so only loopback clients are served"
		} else if r.Header.Get("Authorization") != "" {
			msg = "the token is not valid (wrong, expired or revoked)"
		}
		httpapi.WriteUnauthorized(w, msg)
		return
	}
	if r.Method == http.MethodPost && !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	if tenant != "" && !open && !scopeToTenant(w, r, tenant) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// tokens reports whether access takes tokens (else loopback is open).
func (h *Handler) tokens() bool { return h.cfg.Token != "" || h.cfg.Tenants != nil }

// access checks a request's token: ok, and the tenant a tenant token is
// for ("" for the operator's token, or loopback with no tokens set).
func (h *Handler) access(r *http.Request) (tenant string, ok bool) {
	if !h.tokens() {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		return "", err == nil && ip != nil && ip.IsLoopback()
	}
	got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if c, err := r.Cookie(cookieName); err == nil && got == "" {
		got = c.Value
	}
	return h.check(got)
}

// check checks a token: the operator's, or a tenant's.
func (h *Handler) check(tok string) (tenant string, ok bool) {
	if h.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(h.cfg.Token)) == 1 {
		return "", true
	}
	if h.cfg.Tenants != nil && tok != "" {
		t, err := h.cfg.Tenants(tok)
		if err == nil {
			return t, true
		}
		h.log.Info().Err(err).Msg("tenant token refused")
	}
	return "", false
}

func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return o == ""
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

func (h *Handler) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := h.tmpl.ExecuteTemplate(w, name, data); err != nil {
		h.log.Warn().Err(err).Str("template", name).Msg("rendering")
	}
}

func (h *Handler) loginPage(w http.ResponseWriter, _ *http.Request) {
	h.render(w, "login.html", map[string]any{"Title": "Sign in"})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	tok := r.FormValue("token")
	if _, ok := h.check(tok); !ok {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, "login.html", map[string]any{"Title": "Sign in", "Error": "wrong token"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func reqCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 10*time.Second)
}

func (h *Handler) fleet(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := reqCtx(r)
	defer cancel()
	data := map[string]any{"Title": "Fleet"}
	snap, err := h.cfg.Queue.Snapshot(ctx)
	if err != nil {
		data["Error"] = "reading the queue: " + err.Error()
	}
	data["Snap"] = snap
	tenants := make([]string, 0, len(snap.Tenants))
	for t := range snap.Tenants {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	data["Tenants"] = tenants
	if rep, err := h.cfg.Client.List(ctx, protocol.ListRequest{State: protocol.StateFailed, Limit: 10}); err == nil {
		data["Failures"] = rep.Queries
	}
	// Runs per minute: the queries that ended in the last minute, among
	// the latest ones.
	if rep, err := h.cfg.Client.List(ctx, protocol.ListRequest{Limit: 500}); err == nil {
		n := 0
		for _, q := range rep.Queries {
			if q.State.Terminal() && time.Since(q.At) < time.Minute {
				n++
			}
		}
		data["RunsPerMinute"] = n
	}
	// Failing webhook deliveries, when this dispatcher delivers webhooks.
	if rep, err := webhook.Call(ctx, h.cfg.Client.NC, h.cfg.Client.Names, webhook.OpFailing, webhook.Request{}); err == nil && rep.Error == nil {
		data["HookFailures"] = rep.Deliveries
	}
	h.render(w, "fleet.html", data)
}

func (h *Handler) queries(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := reqCtx(r)
	defer cancel()
	q := r.URL.Query()
	tenant, state := q.Get("tenant"), protocol.State(q.Get("state"))
	search := strings.TrimSpace(q.Get("q"))
	data := map[string]any{"Title": "Queries", "Tenant": tenant, "State": string(state), "Q": search,
		"States": []protocol.State{protocol.StateQueued, protocol.StateRunning, protocol.StateRetrying, protocol.StateSucceeded, protocol.StateFailed, protocol.StateCancelled}}
	var (
		found []protocol.StatusEvent
		err   error
	)
	switch {
	case len(search) > httpapi.MaxQuery:
		err = fmt.Errorf("search: longer than %d bytes", httpapi.MaxQuery)
	case tenant != "" && !protocol.ValidTenant(tenant):
		err = errors.New("tenant: must match " + protocol.TenantPattern)
	case h.cfg.Status != nil:
		var ans httpapi.ListAnswer
		ans, err = httpapi.ListIndex(ctx, h.cfg.Status, tenant, q.Get("cursor"), state, search, h.cfg.PageSize)
		found = ans.Items
		if ans.NextCursor != "" {
			next := url.Values{"tenant": {tenant}, "state": {string(state)}, "q": {search}, "cursor": {ans.NextCursor}}
			data["Next"] = "/queries?" + next.Encode()
		}
		data["Paged"] = true
	default:
		found, err = h.latest(ctx, protocol.ListRequest{Tenant: tenant, State: state, Limit: 100}, search)
	}
	if err != nil {
		data["Error"] = err.Error()
	}
	data["Queries"] = found
	h.render(w, "queries.html", data)
}

// latest lists the latest queries through the dispatcher, those matching
// search (of the latest searchRecords when searching).
func (h *Handler) latest(ctx context.Context, req protocol.ListRequest, search string) ([]protocol.StatusEvent, error) {
	if search != "" {
		req.Limit = searchRecords
	}
	rep, err := h.cfg.Client.List(ctx, req)
	switch {
	case err != nil:
		return nil, err
	case rep.Error != nil:
		return nil, errors.New(rep.Error.Code + ": " + rep.Error.Message)
	}
	found := make([]protocol.StatusEvent, 0, len(rep.Queries))
	for _, ev := range rep.Queries {
		if httpapi.Matches(ev, search) {
			found = append(found, ev)
		}
	}
	return found, nil
}

func (h *Handler) ref(r *http.Request) (protocol.QueryRef, bool) {
	ref := protocol.QueryRef{Tenant: r.PathValue("tenant"), ID: r.PathValue("id")}
	return ref, protocol.ValidTenant(ref.Tenant) && protocol.ValidID(ref.ID)
}

func (h *Handler) query(w http.ResponseWriter, r *http.Request) {
	ref, ok := h.ref(r)
	if !ok {
		http.Error(w, "bad tenant or id", http.StatusBadRequest)
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	data := map[string]any{"Title": ref.Tenant + "/" + ref.ID, "Ref": ref, "Notice": r.URL.Query().Get("notice")}
	rep, err := h.cfg.Client.Status(ctx, ref)
	switch {
	case err != nil:
		data["Error"] = err.Error()
	case rep.Error != nil && rep.Error.Code == protocol.CodeNotFound:
		w.WriteHeader(http.StatusNotFound)
		data["Error"] = "no query " + ref.Tenant + "/" + ref.ID
	case rep.Error != nil:
		data["Error"] = rep.Error.Message
	default:
		data["Status"] = rep.Status
	}
	h.render(w, "query.html", data)
}

// events streams a query over SSE: "line" (a stream-json line), "model" (a
// model call the gateway metered), each after an "at" (when the stream
// stored it, unix ms), "status" (a status event), "artifact" (a workspace
// manifest), then "end".
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	ref, ok := h.ref(r)
	if !ok {
		http.Error(w, "bad tenant or id", http.StatusBadRequest)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	send := func(event string, data []byte) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		fl.Flush()
	}
	sendJSON := func(event string, v any) {
		b, err := json.Marshal(v)
		if err == nil {
			send(event, b)
		}
	}
	// "at" (unix ms) tells when the stream stored the line or model call
	// that follows it, for the run's timeline.
	sendAt := func(at time.Time) {
		if !at.IsZero() {
			send("at", []byte(strconv.FormatInt(at.UnixMilli(), 10)))
		}
	}
	// A browser that lost the stream (a proxy's idle timeout while a
	// session waits for an approval, say) connects again with the id of
	// the last line it got: what it had is not sent twice, so the page
	// shows each line once (lines, and the events stored before them).
	after, _ := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64)
	seen := func() bool { return after == 0 }
	final, err := h.cfg.Client.Follow(r.Context(), ref.Tenant, ref.ID, true, fleetapi.Follower{
		Line: func(l fleetapi.Line) {
			if l.Seq <= after {
				if l.Seq == after {
					after = 0 // what follows is new to the page
				}
				return
			}
			after = 0
			sendAt(l.At)
			data := l.Data
			if !json.Valid(data) {
				data, _ = json.Marshal(map[string]string{"type": "x_text", "text": string(l.Data)})
			}
			fmt.Fprintf(w, "id: %d\n", l.Seq)
			send("line", data)
		},
		Model: func(at time.Time, data []byte) {
			if seen() && json.Valid(data) {
				sendAt(at)
				send("model", data)
			}
		},
		Status: func(ev protocol.StatusEvent) {
			if seen() {
				sendJSON("status", ev)
			}
		},
		Artifact: func(a protocol.Artifact) {
			if seen() {
				sendJSON("artifact", a)
			}
		},
	})
	if err != nil {
		if r.Context().Err() == nil {
			sendJSON("failure", map[string]string{"error": err.Error()})
		}
		return
	}
	sendJSON("end", final)
}

func (h *Handler) back(w http.ResponseWriter, r *http.Request, ref protocol.QueryRef, notice string) {
	http.Redirect(w, r, "/q/"+url.PathEscape(ref.Tenant)+"/"+url.PathEscape(ref.ID)+"?notice="+url.QueryEscape(notice), http.StatusSeeOther)
}

// maxDiffBytes is how much of a workspace diff the page shows.
const maxDiffBytes = 2 << 20

// diff serves a workspace job's stored diff (text/plain), at most
// maxDiffBytes of it; `dispatcher diff` prints it whole.
func (h *Handler) diff(w http.ResponseWriter, r *http.Request) {
	ref, ok := h.ref(r)
	if !ok {
		http.Error(w, "bad tenant or id", http.StatusBadRequest)
		return
	}
	if h.cfg.Objects == nil {
		http.Error(w, "this dashboard has no storage to read diffs from", http.StatusNotFound)
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	b, err := h.cfg.Objects.Get(ctx, storage.DiffKey(ref.Tenant, ref.ID))
	switch {
	case errors.Is(err, storage.ErrNotFound):
		http.Error(w, "no workspace diff stored for this query", http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, "reading the diff: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if len(b) > maxDiffBytes {
		_, _ = w.Write(b[:maxDiffBytes])
		_, _ = fmt.Fprintf(w, "\n… %d more bytes: dispatcher diff %s --tenant %s\n", len(b)-maxDiffBytes, ref.ID, ref.Tenant)
		return
	}
	_, _ = w.Write(b)
}

func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	ref, ok := h.ref(r)
	if !ok {
		http.Error(w, "bad tenant or id", http.StatusBadRequest)
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	rep, err := h.cfg.Client.Cancel(ctx, ref)
	switch {
	case err != nil:
		h.back(w, r, ref, "cancel failed: "+err.Error())
	case rep.Error != nil:
		h.back(w, r, ref, "cancel: "+rep.Error.Message)
	default:
		h.log.Info().Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("cancel requested from the dashboard")
		h.back(w, r, ref, "cancel requested")
	}
}

// sessionOp publishes an input or an approval (ctl ops) for a session.
func (h *Handler) sessionOp(w http.ResponseWriter, r *http.Request) {
	ref, ok := h.ref(r)
	if !ok {
		http.Error(w, "bad tenant or id", http.StatusBadRequest)
		return
	}
	req := protocol.SessionOpRequest{ID: ref.ID, Tenant: ref.Tenant}
	op := protocol.OpInput
	if strings.HasSuffix(r.URL.Path, "/approve") {
		op = protocol.OpApprove
		allow := r.FormValue("allow") == "true"
		req.RequestID, req.Allow, req.Message = r.FormValue("request_id"), &allow, r.FormValue("message")
	} else {
		req.Text = r.FormValue("text")
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	rep, err := h.cfg.Client.SessionOp(ctx, op, req)
	switch {
	case err != nil:
		h.back(w, r, ref, op+" failed: "+err.Error())
	case rep.Error != nil:
		h.back(w, r, ref, op+": "+rep.Error.Message)
	default:
		h.back(w, r, ref, op+" sent")
	}
}
