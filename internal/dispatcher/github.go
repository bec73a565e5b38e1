package dispatcher

// GitHub: <prefix>.api.github (and a tenant's, scoped) adds, lists and
// removes repositories' rules (internal/github keeps them); Inbound serves
// the App's webhooks on POST /v1/github when the App is configured.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func decodeGitHub(data []byte) (github.Request, *protocol.ErrorInfo) {
	var req github.Request
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, apiError(protocol.CodeInvalidJob, "github request: "+err.Error())
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
	if !github.ValidRepo(req.Repo) {
		return req, apiError(protocol.CodeInvalidJob, "repo: must be OWNER/NAME")
	}
	if req.Action == "add" && req.Rule == nil {
		return req, apiError(protocol.CodeInvalidJob, "rule: required")
	}
	return req, nil
}

func decodeGitHubRequest(m micro.Request) (github.Request, *protocol.ErrorInfo) {
	return decodeGitHub(m.Data())
}

func githubFailed(e *protocol.ErrorInfo) github.Reply { return github.Reply{Error: e} }

func (h *api) github(ctx context.Context, req github.Request) github.Reply {
	st := h.githubRules
	switch req.Action {
	case "add":
		r := *req.Rule
		r.Tenant, r.Repo = req.Tenant, req.Repo
		r, err := st.Add(ctx, r)
		if err != nil {
			return github.Reply{Error: githubError(err)}
		}
		h.log.Info().Str("tenant", r.Tenant).Str("repo", r.Repo).Msg("GitHub rule added")
		return github.Reply{Rules: []github.Rule{r}}
	case "rm":
		if err := st.Remove(ctx, req.Tenant, req.Repo); err != nil {
			return github.Reply{Error: githubError(err)}
		}
		return github.Reply{}
	}
	rules, err := st.List(ctx, req.Tenant)
	if err != nil {
		return github.Reply{Error: githubError(err)}
	}
	return github.Reply{Rules: rules}
}

func githubError(err error) *protocol.ErrorInfo {
	switch {
	case errors.Is(err, github.ErrNotFound):
		return apiError(protocol.CodeNotFound, err.Error())
	case errors.Is(err, github.ErrExists):
		return apiError(codeScheduleExists, err.Error())
	case errors.Is(err, github.ErrInvalid):
		return apiError(protocol.CodeInvalidJob, err.Error())
	}
	return apiError(protocol.CodeInternal, err.Error())
}

// githubHandler serves POST /v1/github: the App's webhooks, or 404 when
// no App is configured.
func (s *Service) githubHandler() http.Handler {
	if s.cfg.GitHub == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"code":"not_found","message":"no GitHub App is configured (--github-app-id)"}}`, http.StatusNotFound)
		})
	}
	return &github.Handler{App: s.cfg.GitHub, Rules: s.api.githubRules, Submit: inboundSubmitter{s.api}, Log: s.log}
}
