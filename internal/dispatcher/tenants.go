package dispatcher

// Tenants (docs/tenancy.md): a tenant's account imports <prefix>.tapi.<tenant>.>
// as its <prefix>.api.>, and <prefix>.tjs.<tenant>.… as the few JetStream
// API calls a reader needs (see internal/tenancy). The tenant token of the
// subject is set by nats-server's import, never by the tenant, so it is
// the only tenant a request may act for: a body naming another is
// refused, and one naming none gets it.

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// tenantAPI is the part that serves the tenant-scoped API: the same api
// handlers as the fleet's endpoints, behind decoders that take the tenant
// from the subject, and the tenants' JetStream proxy.
type tenantAPI struct {
	nc    *nats.Conn
	names protocol.Names
	api   *api
	log   zerolog.Logger
	svc   micro.Service
	js    *tenancy.JSProxy
	jobs  *tenantJobs
}

func (t *tenantAPI) start(context.Context) error {
	n, h := t.names, t.api
	svc, err := micro.AddService(t.nc, micro.Config{
		Name:        protocol.ServiceName + "-tenants",
		Version:     buildinfo.SemVer(),
		Description: "agentfleet dispatcher: the fleet API scoped to the tenant of the subject",
		QueueGroup:  queueGroup,
		Metadata:    map[string]string{"prefix": n.Prefix(), "build": buildinfo.Version()},
	})
	if err != nil {
		return fmt.Errorf("dispatcher: tenant micro service: %w", err)
	}
	handlers := map[string]micro.HandlerFunc{
		"submit":   serve(scoped(t, "submit", decodeSubmit), submitFailed, h.submit),
		"cancel":   serve(scoped(t, "cancel", decodeRefRequest), apiFailed, h.cancel),
		"status":   serve(scoped(t, "status", decodeRefRequest), apiFailed, h.status),
		"list":     serve(scoped(t, "list", decodeListRequest), apiFailed, h.list),
		"schedule": serve(scoped(t, "schedule", decodeScheduleRequest), scheduleFailed, h.schedule),
		"trigger":  serve(scoped(t, "trigger", decodeTriggerRequest), triggerFailed, h.trigger),
		"github":   serve(scoped(t, "github", decodeGitHubRequest), githubFailed, h.github),
	}
	for _, op := range sessionOps {
		handlers[op] = serve(scoped(t, op, decodeOpRequest(op)), apiFailed, h.sessionOp)
	}
	for op, hf := range handlers {
		if err := svc.AddEndpoint("tenant-"+op, hf, micro.WithEndpointSubject(n.Prefix()+".tapi.*."+op)); err != nil {
			_ = svc.Stop()
			return fmt.Errorf("dispatcher: tenant endpoint %s: %w", op, err)
		}
	}
	p, err := tenancy.ServeJS(t.nc, n.Prefix())
	if err != nil {
		_ = svc.Stop()
		return err
	}
	jobs := &tenantJobs{nc: t.nc, names: n, log: t.log}
	if err := jobs.start(); err != nil {
		_ = svc.Stop()
		_ = p.Stop(context.Background())
		return err
	}
	t.svc, t.js, t.jobs = svc, p, jobs
	return nil
}

func (t *tenantAPI) stop(ctx context.Context) error {
	if t.svc == nil {
		return nil
	}
	err := t.svc.Stop()
	if t.js != nil {
		_ = t.js.Stop(ctx)
	}
	if t.jobs != nil {
		_ = t.jobs.stop(ctx)
	}
	t.svc, t.js, t.jobs = nil, nil, nil
	return err
}

// scoped wraps decode so that it decodes the request made the subject's
// tenant's: the body is replaced by tenancy's scoping of it (always JSON).
func scoped[Req any](t *tenantAPI, op string, decode func(micro.Request) (Req, *protocol.ErrorInfo)) func(micro.Request) (Req, *protocol.ErrorInfo) {
	return func(m micro.Request) (Req, *protocol.ErrorInfo) {
		tenant, _, err := tenancy.ParseTenantAPISubject(t.names.Prefix(), m.Subject())
		var body []byte
		if err == nil {
			if op == "submit" {
				body, err = tenancy.ScopeJob(tenant, m.Headers().Get(protocol.HeaderContentType), m.Data())
			} else {
				body, err = tenancy.ScopeRequest(tenant, m.Data())
			}
		}
		if err != nil {
			t.log.Warn().Err(err).Str("subject", m.Subject()).Msg("tenant request refused")
			var zero Req
			return zero, apiError(protocol.CodeInvalidJob, err.Error())
		}
		return decode(scopedRequest{Request: m, data: body})
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
