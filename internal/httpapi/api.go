package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// Config configures the API.
type Config struct {
	// Client talks to the fleet (the dispatcher's API, FLEET_QUERIES).
	// Required.
	Client *fleetapi.Client
	// Status is the status store, whose keys are the index GET /v1/queries
	// pages. Required.
	Status storage.Store
	// Objects is where workspace diffs are; nil: GET .../diff is 404.
	Objects storage.Store
	// Auth authenticates requests. Required (Auth{} is loopback-only).
	Auth Authenticator
	// Heartbeat is how often an idle event stream gets a comment line
	// (proxies close silent connections); 0 = 15s.
	Heartbeat time.Duration
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// API serves /v1/.
type API struct {
	cfg Config
	log zerolog.Logger
	mux *http.ServeMux
}

// requestTimeout bounds one request to the dispatcher: a refusal or a
// lost answer is a 503 within it, never a hang.
const requestTimeout = 5 * time.Second

// New returns the API's handler.
func New(cfg Config) (*API, error) {
	if cfg.Client == nil || cfg.Status == nil || cfg.Auth == nil {
		return nil, errors.New("httpapi: Client, Status and Auth are required")
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	a := &API{cfg: cfg, log: cfg.Logger.With().Str("component", "httpapi").Logger(), mux: http.NewServeMux()}
	a.mux.HandleFunc("GET /v1/openapi.json", serveOpenAPI)
	a.route("POST /v1/queries", a.submit)
	a.route("GET /v1/queries", a.list)
	a.route("GET /v1/queries/{id}", a.get)
	a.route("GET /v1/queries/{id}/events", a.events)
	a.route("POST /v1/queries/{id}/cancel", a.cancel)
	a.route("POST /v1/queries/{id}/input", a.input)
	a.route("POST /v1/queries/{id}/end", a.end)
	a.route("POST /v1/queries/{id}/approvals/{request_id}", a.approve)
	a.route("GET /v1/queries/{id}/diff", a.diff)
	a.routeSchedules()
	a.mux.HandleFunc("/v1/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such endpoint; see /v1/openapi.json")
	})
	return a, nil
}

// Mount serves api at /v1/ and ui (the dashboard; nil: nothing) at every
// other path: the handler `dispatcher serve --http` serves.
func Mount(api http.Handler, ui http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	if ui != nil {
		mux.Handle("/", ui)
	}
	return mux
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	a.mux.ServeHTTP(w, r)
}

type handler func(w http.ResponseWriter, r *http.Request, p Principal)

// route registers h behind authentication.
func (a *API) route(pattern string, h handler) {
	a.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		p, err := a.cfg.Auth.Authenticate(r)
		if err != nil {
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, err.Error())
			return
		}
		h(w, r, p)
	})
}

// ref is the query a per-query request is about, or false after answering
// 404 (a tenant principal asking about another tenant, a malformed id).
func (a *API) ref(w http.ResponseWriter, r *http.Request, p Principal) (protocol.QueryRef, bool) {
	tenant, ok := p.tenantFor(r.URL.Query().Get("tenant"))
	ref := protocol.QueryRef{ID: r.PathValue("id"), Tenant: tenant}
	if !ok || !protocol.ValidID(ref.ID) || !protocol.ValidTenant(ref.Tenant) {
		writeError(w, http.StatusNotFound, CodeNotFound, "no query "+ref.ID)
		return ref, false
	}
	return ref, true
}

// SubmitAnswer is POST /v1/queries's 202 body.
type SubmitAnswer struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	StatusURL string `json:"status_url"`
	EventsURL string `json:"events_url"`
}

func queryURL(ref protocol.QueryRef, p Principal, suffix string) string {
	u := "/v1/queries/" + url.PathEscape(ref.ID) + suffix
	if p.Operator && ref.Tenant != protocol.DefaultTenant {
		u += "?tenant=" + url.QueryEscape(ref.Tenant)
	}
	return u
}

func (a *API) submit(w http.ResponseWriter, r *http.Request, p Principal) {
	b, err := readBody(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	_, job, err := decodeJob(b, p)
	switch {
	case errors.Is(err, errForbidden):
		writeError(w, http.StatusForbidden, CodeForbidden, err.Error())
		return
	case errors.Is(err, protocol.ErrInvalidJob):
		writeError(w, http.StatusBadRequest, CodeInvalidJob, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(a.traceContext(r, job), requestTimeout)
	defer cancel()
	// The job as decoded into the fleet's own type, re-encoded by the
	// client: never the caller's bytes.
	rep, err := a.cfg.Client.Submit(ctx, job)
	switch {
	case errors.Is(err, fleetapi.ErrUnavailable):
		a.unavailable(w, err)
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, CodeInternal, "submitting: "+err.Error())
		return
	case rep.Error != nil && rep.Error.Code == protocol.CodeInvalidJob:
		writeError(w, http.StatusBadRequest, CodeInvalidJob, rep.Error.Message)
		return
	case rep.Error != nil:
		writeError(w, http.StatusBadGateway, rep.Error.Code, rep.Error.Message)
		return
	case rep.Duplicate:
		writeError(w, http.StatusConflict, CodeDuplicate, "query "+rep.ID+" of tenant "+rep.Tenant+" was submitted moments ago: nothing new was queued")
		return
	}
	a.log.Info().Str("tenant", rep.Tenant).Str("query_id", rep.ID).Bool("operator", p.Operator).Msg("submitted over HTTP")
	ref := protocol.QueryRef{ID: rep.ID, Tenant: rep.Tenant}
	w.Header().Set("Location", queryURL(ref, p, ""))
	writeJSON(w, http.StatusAccepted, SubmitAnswer{ID: rep.ID, Tenant: rep.Tenant,
		StatusURL: queryURL(ref, p, ""), EventsURL: queryURL(ref, p, "/events")})
}

func (a *API) unavailable(w http.ResponseWriter, err error) {
	a.log.Warn().Err(err).Msg("the dispatcher did not answer")
	writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the dispatcher did not answer in time: "+err.Error())
}

// status answers the dispatcher's reply to a status-like request.
func (a *API) status(w http.ResponseWriter, ok int, rep protocol.APIReply, err error) {
	switch {
	case errors.Is(err, fleetapi.ErrUnavailable):
		a.unavailable(w, err)
	case err != nil:
		writeError(w, http.StatusBadGateway, CodeInternal, err.Error())
	case rep.Error != nil && rep.Error.Code == protocol.CodeNotFound:
		writeError(w, http.StatusNotFound, CodeNotFound, rep.Error.Message)
	case rep.Error != nil && rep.Error.Code == "no_such_request":
		writeError(w, http.StatusNotFound, rep.Error.Code, rep.Error.Message)
	case rep.Error != nil && rep.Error.Code == CodeFinished:
		writeError(w, http.StatusConflict, CodeFinished, rep.Error.Message)
	case rep.Error != nil && rep.Error.Code == protocol.CodeInvalidJob:
		writeError(w, http.StatusBadRequest, CodeBadRequest, rep.Error.Message)
	case rep.Error != nil:
		writeError(w, http.StatusConflict, rep.Error.Code, rep.Error.Message)
	case rep.Status == nil:
		writeJSON(w, ok, map[string]any{"ok": true})
	default:
		writeJSON(w, ok, rep.Status)
	}
}

func (a *API) get(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	rep, err := a.cfg.Client.Status(ctx, ref)
	a.status(w, http.StatusOK, rep, err)
}

// exists answers 404 (and false) unless the query has a status.
func (a *API) exists(ctx context.Context, w http.ResponseWriter, ref protocol.QueryRef) (*protocol.StatusEvent, bool) {
	rep, err := a.cfg.Client.Status(ctx, ref)
	if err != nil || rep.Error != nil {
		a.status(w, http.StatusOK, rep, err)
		return nil, false
	}
	return rep.Status, true
}

func (a *API) cancel(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	if err := emptyBody(r); err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if _, ok := a.exists(ctx, w, ref); !ok {
		return
	}
	rep, err := a.cfg.Client.Cancel(ctx, ref)
	a.status(w, http.StatusAccepted, rep, err)
}

func (a *API) sessionOp(w http.ResponseWriter, r *http.Request, ref protocol.QueryRef, op string, req protocol.SessionOpRequest) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	if _, ok := a.exists(ctx, w, ref); !ok {
		return
	}
	req.ID, req.Tenant = ref.ID, ref.Tenant
	rep, err := a.cfg.Client.SessionOp(ctx, op, req)
	a.status(w, http.StatusAccepted, rep, err)
}

func (a *API) input(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	in, err := decodeBody(r, decodeInput)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	a.sessionOp(w, r, ref, protocol.OpInput, protocol.SessionOpRequest{SessionOp: protocol.SessionOp{Text: in.Text}})
}

func (a *API) end(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	if err := emptyBody(r); err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	a.sessionOp(w, r, ref, protocol.OpEnd, protocol.SessionOpRequest{})
}

func (a *API) approve(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	rid := r.PathValue("request_id")
	if rid == "" || len(rid) > protocol.MaxRequestIDBytes {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "request_id: must be 1 to 256 bytes")
		return
	}
	ab, err := decodeBody(r, decodeApproval)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	a.sessionOp(w, r, ref, protocol.OpApprove, protocol.SessionOpRequest{SessionOp: protocol.SessionOp{
		RequestID: rid, Allow: ab.Allow, Message: ab.Message}})
}

func (a *API) diff(w http.ResponseWriter, r *http.Request, p Principal) {
	ref, ok := a.ref(w, r, p)
	if !ok {
		return
	}
	if a.cfg.Objects == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "this server has no storage to read diffs from")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	b, err := a.cfg.Objects.Get(ctx, storage.DiffKey(ref.Tenant, ref.ID))
	switch {
	case errors.Is(err, storage.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, "no workspace diff stored for query "+ref.ID)
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, CodeInternal, "reading the diff: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write(b)
}

// decodeBody reads r's body and decodes it with decode.
func decodeBody[T any](r *http.Request, decode func([]byte) (T, error)) (T, error) {
	b, err := readBody(r)
	if err != nil {
		var zero T
		return zero, err
	}
	return decode(b)
}

// traceContext is r's context carrying the producer's W3C traceparent
// (and tracestate) header, passed on to the job; a malformed one is
// ignored.
func (a *API) traceContext(r *http.Request, job protocol.Job) context.Context {
	tp := r.Header.Get(tracing.HeaderTraceparent)
	if tp == "" {
		return r.Context()
	}
	ctx, ok := tracing.WithTraceparent(r.Context(), tp, r.Header.Get(tracing.HeaderTracestate))
	if !ok {
		a.log.Debug().Str("tenant", job.Tenant).Str("query_id", job.ID).Msg("the request's traceparent is malformed; ignored")
	}
	return ctx
}
