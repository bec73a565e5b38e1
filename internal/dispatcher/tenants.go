package dispatcher

// Tenants (SPEC 12): a tenant's account imports <prefix>.tapi.<tenant>.>
// as its <prefix>.api.>, and <prefix>.tjs.<tenant>.… as the few JetStream
// API calls a reader needs (see internal/tenancy). The tenant token of the
// subject is set by nats-server's import, never by the tenant, so it is
// the only tenant a request may act for: a body naming another is
// refused, and one naming none gets it.

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// serveTenants adds the tenant API endpoints to the micro service and
// starts the tenants' JetStream proxy.
func (s *Service) serveTenants() error {
	s.mu.Lock()
	api := s.api
	s.mu.Unlock()
	handlers := map[string]micro.HandlerFunc{
		"submit": s.handleSubmit, "cancel": s.handleCancel, "status": s.handleStatus, "list": s.handleList,
	}
	for _, op := range sessionOps {
		handlers[op] = func(m micro.Request) { s.handleSessionOp(op, m) }
	}
	prefix := s.names.Prefix()
	for op, h := range handlers {
		err := api.AddEndpoint("tenant-"+op, s.tenantScoped(op, h), micro.WithEndpointSubject(prefix+".tapi.*."+op))
		if err != nil {
			return fmt.Errorf("dispatcher: tenant endpoint %s: %w", op, err)
		}
	}
	p, err := tenancy.ServeJS(s.cfg.NC, prefix)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.subs = append(s.subs, p.Subscription())
	s.mu.Unlock()
	return nil
}

// tenantScoped runs h on the request made the subject's tenant's.
func (s *Service) tenantScoped(op string, h micro.HandlerFunc) micro.HandlerFunc {
	return func(m micro.Request) {
		tenant, _, err := tenancy.ParseTenantAPISubject(s.names.Prefix(), m.Subject())
		var body []byte
		if err == nil {
			if op == "submit" {
				body, err = tenancy.ScopeJob(tenant, m.Headers().Get(protocol.HeaderContentType), m.Data())
			} else {
				body, err = tenancy.ScopeRequest(tenant, m.Data())
			}
		}
		if err != nil {
			s.log.Warn().Err(err).Str("subject", m.Subject()).Msg("tenant request refused")
			e := apiError(protocol.CodeInvalidJob, err.Error())
			if op == "submit" {
				reply(m, protocol.SubmitReply{Error: e})
			} else {
				reply(m, protocol.APIReply{Error: e})
			}
			return
		}
		h(scopedRequest{Request: m, data: body})
	}
}

// scopedRequest is a request with its body replaced (always JSON).
type scopedRequest struct {
	micro.Request
	data []byte
}

func (r scopedRequest) Data() []byte { return r.data }

func (r scopedRequest) Headers() micro.Headers {
	h := nats.Header{}
	h.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	return micro.Headers(h)
}
