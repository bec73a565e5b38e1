package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// maxInactive bounds a tenant consumer's inactivity threshold, so one
// whose reader died goes away.
const maxInactive = 5 * time.Minute

// JSProxy answers tenants' JetStream API calls that cannot be imported
// raw: a consumer create (its body may name a deliver subject, where the
// server would then write in FLEET, or a durable), consumer info and
// delete (by name alone, they would reach the fleet's durables), and the
// body form of message gets (a sequence reaches every tenant's messages).
// Each is checked against the tenant of its subject and forwarded with
// the dispatcher's own credentials.
type JSProxy struct {
	nc      *nats.Conn
	prefix  string
	stream  string
	timeout time.Duration
	sub     *nats.Subscription
}

// ServeJS starts a JSProxy on nc (the dispatcher's connection) in a queue
// group, so several dispatchers share it. Drain its Subscription to stop it.
func ServeJS(nc *nats.Conn, prefix string) (*JSProxy, error) {
	p := &JSProxy{nc: nc, prefix: prefix, stream: protocol.NewNames(prefix).QueriesStream(), timeout: 10 * time.Second}
	sub, err := nc.QueueSubscribe(prefix+".tjs.*.>", "fleet-tjs", p.handle)
	if err != nil {
		return nil, fmt.Errorf("tenancy: serving the tenants' JetStream API: %w", err)
	}
	p.sub = sub
	return p, nil
}

// Subscription is the proxy's; draining it stops the proxy once the
// requests in flight are answered.
func (p *JSProxy) Subscription() *nats.Subscription { return p.sub }

func (p *JSProxy) handle(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	rest, _ := strings.CutPrefix(m.Subject, p.prefix+".tjs.")
	tenant, call, _ := strings.Cut(rest, ".")
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	resp, err := p.forward(ctx, tenant, call, m)
	if err != nil {
		_ = m.Respond(jsError(err))
		return
	}
	out := nats.NewMsg(m.Reply)
	out.Data, out.Header = resp.Data, resp.Header
	_ = m.RespondMsg(out)
}

// forward checks call ($JS.API.<call>) for tenant and sends it on.
func (p *JSProxy) forward(ctx context.Context, tenant, call string, m *nats.Msg) (*nats.Msg, error) {
	if ValidTenant(tenant) != nil {
		return nil, fmt.Errorf("%w: no tenant in %q", ErrScope, m.Subject)
	}
	own := p.prefix + ".query." + tenant + "."
	data := m.Data
	switch {
	case strings.HasPrefix(call, "CONSUMER.CREATE."+p.stream+"."):
		name, filter, _ := strings.Cut(strings.TrimPrefix(call, "CONSUMER.CREATE."+p.stream+"."), ".")
		var err error
		if data, err = CheckConsumerCreate(name, filter, own, m.Data); err != nil {
			return nil, err
		}
	case strings.HasPrefix(call, "CONSUMER.INFO."+p.stream+"."), strings.HasPrefix(call, "CONSUMER.DELETE."+p.stream+"."):
		name := call[strings.LastIndexByte(call, '.')+1:]
		info, err := p.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.INFO."+p.stream+"."+name, nil)
		if err != nil {
			return nil, err
		}
		if !ownConsumer(info.Data, own) {
			return nil, fmt.Errorf("%w: consumer %q is not one of tenant %s's readers", ErrScope, name, tenant)
		}
		if strings.HasPrefix(call, "CONSUMER.INFO.") {
			return info, nil
		}
	case call == "STREAM.MSG.GET."+p.stream, call == "DIRECT.GET."+p.stream:
		if err := CheckMsgGet(own, m.Data); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: $JS.API.%s", ErrScope, call)
	}
	req := nats.NewMsg("$JS.API." + call)
	req.Data, req.Header = data, m.Header
	return p.nc.RequestMsgWithContext(ctx, req)
}

// CheckConsumerCreate checks a consumer create request of a tenant whose
// subjects start with own: the create subject's filter within own, a body
// with no deliver subject or group, no durable, no other filters, the
// same name and filter, and an inactivity threshold (at most 5 minutes).
// It returns the body to send: action "create", so an existing consumer
// (the fleet's own) is never updated.
func CheckConsumerCreate(name, filter, own string, data []byte) ([]byte, error) {
	if name == "" || filter == "" || !strings.HasPrefix(filter, own) {
		return nil, fmt.Errorf("%w: a consumer must filter within %s>", ErrScope, own)
	}
	if slices.Contains(FleetDurables, name) {
		return nil, fmt.Errorf("%w: %q is the name of one of the fleet's consumers", ErrScope, name)
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: consumer create request: %w", ErrScope, err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(req["config"], &cfg); err != nil || cfg == nil {
		return nil, fmt.Errorf("%w: consumer create request without a config", ErrScope)
	}
	for k := range cfg {
		switch strings.ToLower(k) {
		case "deliver_subject", "deliver_group", "durable_name", "filter_subjects":
			return nil, fmt.Errorf("%w: a tenant's consumer may not set %s", ErrScope, k)
		}
	}
	str := func(k string) string {
		var s string
		_ = json.Unmarshal(cfg[k], &s)
		return s
	}
	if n := str("name"); n != "" && n != name {
		return nil, fmt.Errorf("%w: the consumer's name differs from its create subject's", ErrScope)
	}
	if f := str("filter_subject"); f != "" && f != filter {
		return nil, fmt.Errorf("%w: the consumer's filter differs from its create subject's", ErrScope)
	}
	var inactive int64
	_ = json.Unmarshal(cfg["inactive_threshold"], &inactive)
	if inactive <= 0 || inactive > int64(maxInactive) {
		inactive = int64(maxInactive)
	}
	cfg["inactive_threshold"], _ = json.Marshal(inactive)
	cfg["name"], _ = json.Marshal(name)
	cfg["filter_subject"], _ = json.Marshal(filter)
	req["config"], _ = json.Marshal(cfg)
	req["action"] = json.RawMessage(`"create"`)
	return json.Marshal(req)
}

// ownConsumer reports whether a consumer info reply is of an ephemeral,
// pull reader filtered within own.
func ownConsumer(data []byte, own string) bool {
	var r struct {
		Config *struct {
			Durable        string   `json:"durable_name"`
			DeliverSubject string   `json:"deliver_subject"`
			Filter         string   `json:"filter_subject"`
			Filters        []string `json:"filter_subjects"`
		} `json:"config"`
	}
	if json.Unmarshal(data, &r) != nil || r.Config == nil {
		return false
	}
	c := r.Config
	if c.Durable != "" || c.DeliverSubject != "" || len(c.Filters) > 0 {
		return false
	}
	return strings.HasPrefix(c.Filter, own)
}

// CheckMsgGet checks a message get request body: only the last message
// of a subject within own.
func CheckMsgGet(own string, data []byte) error {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(data, &req); err != nil {
		return fmt.Errorf("%w: message get request: %w", ErrScope, err)
	}
	var subj string
	for k, v := range req {
		if k != "last_by_subj" {
			return fmt.Errorf("%w: a tenant may get only the last message of a subject (not %s)", ErrScope, k)
		}
		_ = json.Unmarshal(v, &subj)
	}
	if !strings.HasPrefix(subj, own) || strings.ContainsAny(subj, "*> ") {
		return fmt.Errorf("%w: subject %q is not within %s>", ErrScope, subj, own)
	}
	return nil
}

// jsError is a JetStream API error reply.
func jsError(err error) []byte {
	b, _ := json.Marshal(map[string]any{
		"type":  "io.nats.jetstream.api.v1.error",
		"error": map[string]any{"code": 403, "err_code": 10000, "description": err.Error()},
	})
	return b
}
