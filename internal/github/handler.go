package github

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	gh "github.com/google/go-github/v89/github"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// MaxBody is the largest webhook body taken (GitHub caps its own at 25 MiB).
const MaxBody = 25 << 20

// Submitter is what the handler starts jobs with: the dispatcher's own
// submit, and its status index to find an earlier delivery's job.
type Submitter interface {
	Submit(ctx context.Context, job *protocol.Job) protocol.SubmitReply
	Exists(ctx context.Context, tenant, id string) bool
}

// Handler serves POST /v1/github.
type Handler struct {
	App    *App
	Rules  *Store
	Submit Submitter
	Log    zerolog.Logger
}

// Accepted is the answer to a delivery that started (or had started) a job.
type Accepted struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, code int, errCode, msg string) {
	h.Log.Info().Str("delivery", r.Header.Get("X-GitHub-Delivery")).Int("status", code).Str("reason", msg).Msg("GitHub webhook refused")
	writeJSON(w, code, map[string]any{"error": map[string]string{"code": errCode, "message": msg}})
}

func (h *Handler) ignore(w http.ResponseWriter, r *http.Request, reason string) {
	h.Log.Info().Str("delivery", r.Header.Get("X-GitHub-Delivery")).Str("reason", reason).Msg("GitHub webhook ignored")
	writeJSON(w, http.StatusAccepted, map[string]string{"ignored": reason})
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.fail(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "POST a GitHub webhook")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		h.fail(w, r, http.StatusRequestEntityTooLarge, "too_large", "the body is over 25 MiB")
		return
	}
	payload, err := gh.ValidatePayloadFromBody(r.Header.Get("Content-Type"), bytes.NewReader(body), r.Header.Get(gh.SHA256SignatureHeader), h.App.secret)
	if err != nil || r.Header.Get(gh.SHA256SignatureHeader) == "" {
		h.fail(w, r, http.StatusUnauthorized, "bad_signature", "X-Hub-Signature-256 does not verify with the webhook secret")
		return
	}
	delivery := gh.DeliveryID(r)
	if delivery == "" || len(delivery) > 200 {
		h.fail(w, r, http.StatusBadRequest, "invalid_body", "X-GitHub-Delivery is missing")
		return
	}
	ev, err := Parse(gh.WebHookType(r), payload)
	if errors.Is(err, ErrUnhandled) {
		h.ignore(w, r, err.Error())
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "invalid_body", "the payload does not decode: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	rule, err := h.Rules.Get(ctx, ev.Repo)
	if errors.Is(err, ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, protocol.CodeNotFound, "no rule for the repository "+ev.Repo+" (dispatcher tenant github add)")
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusServiceUnavailable, "unavailable", "reading the repository's rule: "+err.Error())
		return
	}
	if ev.Installation == 0 {
		h.fail(w, r, http.StatusNotFound, protocol.CodeNotFound, "the event names no installation of the app")
		return
	}
	if why := rule.Match(ev); why != "" {
		h.ignore(w, r, why)
		return
	}
	h.start(ctx, w, r, rule, ev, delivery)
}

// start mints the job's token, finds a pull request's head and submits.
func (h *Handler) start(ctx context.Context, w http.ResponseWriter, r *http.Request, rule Rule, ev *Event, delivery string) {
	id := JobID(delivery)
	if h.Submit.Exists(ctx, rule.Tenant, id) {
		writeJSON(w, http.StatusAccepted, Accepted{ID: id, Tenant: rule.Tenant, Duplicate: true})
		return
	}
	token, err := h.App.Token(ctx, ev.Installation, ev.Name)
	if err != nil {
		if c := StatusCode(err); c == http.StatusNotFound || c == http.StatusUnprocessableEntity || c == http.StatusForbidden {
			h.fail(w, r, http.StatusNotFound, protocol.CodeNotFound, "GitHub knows no installation of the app on "+ev.Repo+": "+err.Error())
			return
		}
		h.fail(w, r, http.StatusBadGateway, "unavailable", "minting the installation token: "+err.Error())
		return
	}
	var head string
	if ev.PR {
		pr, _, err := h.App.As(token).PullRequests.Get(ctx, ev.Owner, ev.Name, ev.Number)
		if err != nil {
			h.fail(w, r, http.StatusBadGateway, "unavailable", "reading the pull request: "+err.Error())
			return
		}
		if !equalFold(pr.GetHead().GetRepo().GetFullName(), ev.Repo) {
			h.ignore(w, r, "the pull request's branch is in another repository (a fork)")
			return
		}
		head = pr.GetHead().GetRef()
	}
	job, err := rule.Job(ev, delivery, head, token)
	if err != nil {
		h.fail(w, r, http.StatusUnprocessableEntity, protocol.CodeInvalidJob, err.Error())
		return
	}
	rep := h.Submit.Submit(ctx, job)
	if rep.Error != nil {
		code := http.StatusServiceUnavailable
		if rep.Error.Code == protocol.CodeInvalidJob {
			code = http.StatusUnprocessableEntity
		}
		h.fail(w, r, code, rep.Error.Code, rep.Error.Message)
		return
	}
	h.Log.Info().Str("tenant", rule.Tenant).Str("repo", ev.Repo).Str("event", ev.Kind()).Str("query_id", job.ID).Bool("duplicate", rep.Duplicate).Msg("GitHub event started a job")
	writeJSON(w, http.StatusAccepted, Accepted{ID: job.ID, Tenant: rule.Tenant, Duplicate: rep.Duplicate})
}

func equalFold(a, b string) bool { return len(a) == len(b) && bytes.EqualFold([]byte(a), []byte(b)) }
