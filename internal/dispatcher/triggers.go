package dispatcher

// Inbound webhook triggers: <prefix>.api.trigger (and a tenant's, scoped)
// adds, lists and removes them (internal/trigger keeps them); Inbound
// serves their deliveries on /v1/triggers/ beside the HTTP API, submitting
// through api.submit.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// maxTemplate bounds a trigger's job template.
const maxTemplate = 64 << 10

func decodeTrigger(data []byte) (trigger.Request, *protocol.ErrorInfo) {
	var req trigger.Request
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, apiError(protocol.CodeInvalidJob, "trigger request: "+err.Error())
	}
	if req.Tenant != "" && !protocol.ValidTenant(req.Tenant) {
		return req, apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)
	}
	switch req.Action {
	case "ls":
		return req, nil
	case "add", "rm":
	default:
		return req, apiError(protocol.CodeInvalidJob, `action: must be "add", "ls" or "rm"`)
	}
	if req.Tenant == "" {
		return req, apiError(protocol.CodeInvalidJob, "tenant: required")
	}
	if !protocol.ValidScheduleName(req.Name) {
		return req, apiError(protocol.CodeInvalidJob, "name: must match "+protocol.ScheduleNamePattern)
	}
	if req.Action == "add" && (len(req.Template) == 0 || len(req.Template) > maxTemplate) {
		return req, apiError(protocol.CodeInvalidJob, "template: a job in JSON of at most 64 KiB is required")
	}
	return req, nil
}

func (h *api) trigger(ctx context.Context, req trigger.Request) trigger.Reply {
	st := h.triggers
	info := func(d trigger.Definition) trigger.Info {
		return trigger.Info{Tenant: d.Tenant, Name: d.Name, Path: trigger.Path(d.Tenant, d.Name), Secret: d.Secret,
			Template: d.Template, Created: d.Created.Format("2006-01-02T15:04:05Z07:00")}
	}
	switch req.Action {
	case "add":
		def, err := st.Add(ctx, req.Tenant, req.Name, req.Template)
		if err != nil {
			return trigger.Reply{Error: triggerError(err)}
		}
		h.log.Info().Str("tenant", req.Tenant).Str("trigger", req.Name).Msg("trigger added")
		return trigger.Reply{Triggers: []trigger.Info{info(def)}}
	case "rm":
		if err := st.Remove(ctx, req.Tenant, req.Name); err != nil {
			return trigger.Reply{Error: triggerError(err)}
		}
		return trigger.Reply{}
	}
	defs, err := st.List(ctx, req.Tenant)
	if err != nil {
		return trigger.Reply{Error: triggerError(err)}
	}
	out := []trigger.Info{}
	for _, d := range defs {
		out = append(out, info(d))
	}
	return trigger.Reply{Triggers: out}
}

func triggerError(err error) *protocol.ErrorInfo {
	switch {
	case errors.Is(err, trigger.ErrNotFound):
		return apiError(protocol.CodeNotFound, err.Error())
	case errors.Is(err, trigger.ErrExists):
		return apiError(codeScheduleExists, err.Error())
	case errors.Is(err, trigger.ErrTemplate):
		return apiError(protocol.CodeInvalidJob, err.Error())
	}
	return apiError(protocol.CodeInternal, err.Error())
}

// inboundSubmitter is the api as internal/trigger's Submitter.
type inboundSubmitter struct{ h *api }

func (s inboundSubmitter) Submit(ctx context.Context, job *protocol.Job) protocol.SubmitReply {
	if err := job.Validate("", true); err != nil {
		return protocol.SubmitReply{Error: apiError(protocol.CodeInvalidJob, err.Error())}
	}
	return s.h.submit(ctx, job)
}

func (s inboundSubmitter) Exists(ctx context.Context, tenant, id string) bool {
	_, err := s.h.index.lookup(ctx, protocol.QueryRef{Tenant: tenant, ID: id})
	return err == nil
}

// Inbound wraps next (the HTTP API and dashboard) to serve signed inbound
// webhooks on POST /v1/triggers/{tenant}/{name} and a GitHub App's on
// POST /v1/github first; they carry their own signature, not a bearer
// token.
func (s *Service) Inbound(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/triggers/{tenant}/{name}", &trigger.Handler{Store: s.api.triggers, Submit: inboundSubmitter{s.api}, Log: s.log})
	mux.Handle("/v1/github", s.githubHandler())
	mux.Handle("/", next)
	return mux
}
