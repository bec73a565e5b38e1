package trigger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/rs/zerolog"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// MaxBody is the largest webhook body taken.
const MaxBody = 1 << 20

// Submitter is what the handler starts jobs with: the dispatcher's own
// submit, and its status index to find an earlier delivery's job.
type Submitter interface {
	Submit(ctx context.Context, job *protocol.Job) protocol.SubmitReply
	Exists(ctx context.Context, tenant, id string) bool
}

// Handler serves POST /v1/triggers/{tenant}/{name}.
type Handler struct {
	Store  *Store
	Submit Submitter
	Log    zerolog.Logger
}

// Accepted is the answer to a delivery that was taken.
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
	h.Log.Info().Str("path", r.URL.Path).Int("status", code).Str("reason", msg).Msg("inbound webhook refused")
	writeJSON(w, code, map[string]any{"error": map[string]string{"code": errCode, "message": msg}})
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.fail(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "POST a signed webhook")
		return
	}
	tenant, name := r.PathValue("tenant"), r.PathValue("name")
	if !protocol.ValidTenant(tenant) || !protocol.ValidScheduleName(name) {
		h.fail(w, r, http.StatusNotFound, "not_found", "no such trigger")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		h.fail(w, r, http.StatusRequestEntityTooLarge, "too_large", "the body is over 1 MiB")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	def, err := h.Store.Get(ctx, tenant, name)
	if errors.Is(err, ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "not_found", "no such trigger")
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusServiceUnavailable, "unavailable", "reading the trigger: "+err.Error())
		return
	}
	wh, err := standardwebhooks.NewWebhook(def.Secret)
	if err == nil {
		err = wh.Verify(body, r.Header)
	}
	if err != nil {
		h.fail(w, r, http.StatusUnauthorized, "bad_signature", "the webhook signature does not verify: "+err.Error())
		return
	}
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil || fields == nil {
		h.fail(w, r, http.StatusBadRequest, "invalid_body", "the body must be a JSON object")
		return
	}
	job, err := Render(def.Template, tenant, fields)
	if err != nil {
		h.fail(w, r, http.StatusUnprocessableEntity, protocol.CodeInvalidJob, err.Error())
		return
	}
	webhookID := r.Header.Get("webhook-id")
	job.ID = JobID(name, webhookID)
	job.Trigger = &protocol.Trigger{Kind: protocol.TriggerWebhook, Name: name, Delivery: webhookID}
	if h.Submit.Exists(ctx, tenant, job.ID) {
		writeJSON(w, http.StatusAccepted, Accepted{ID: job.ID, Tenant: tenant, Duplicate: true})
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
	h.Log.Info().Str("tenant", tenant).Str("trigger", name).Str("query_id", job.ID).Bool("duplicate", rep.Duplicate).Msg("inbound webhook started a job")
	writeJSON(w, http.StatusAccepted, Accepted{ID: job.ID, Tenant: tenant, Duplicate: rep.Duplicate})
}
