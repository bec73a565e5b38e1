package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ErrBusy: the proxy already serves as many requests (the tenant's, or
// all tenants') as it may at once; the caller may retry.
var ErrBusy = errors.New("tenancy: the dispatcher's JetStream proxy is busy")

// ProxyOptions configure a JSProxy. Zero values take the defaults.
type ProxyOptions struct {
	// Upstream is the JetStream API prefix requests are sent on (default
	// $JS.API, the dispatcher's own account's).
	Upstream string
	// Timeout bounds each upstream request (default 10s).
	Timeout time.Duration
	// MaxInFlight bounds the requests served at once (default 256), and
	// MaxPerTenant those of one tenant (default 32): a request over
	// either is refused at once as busy, never queued behind others.
	MaxInFlight, MaxPerTenant int
}

// JSProxy answers tenants' JetStream API calls that cannot be imported
// raw: a consumer create (its body may name a deliver subject, where the
// server would then write in FLEET, or a durable), consumer info and
// delete (by name alone, they would reach the fleet's durables), and the
// body form of message gets (a sequence reaches every tenant's messages).
// Each is decoded into the fleet's own types against the tenant of its
// subject, and the proxy sends a request it builds itself from them
// (never the tenant's bytes or headers) with the dispatcher's
// credentials. Requests are served concurrently, each in its own
// goroutine, within the limits of ProxyOptions.
type JSProxy struct {
	nc     *nats.Conn
	prefix string
	stream string
	opts   ProxyOptions
	sub    *nats.Subscription

	mu       sync.Mutex
	inFlight int
	byTenant map[string]int
	wg       sync.WaitGroup
}

// ServeJS starts a JSProxy on nc (the dispatcher's connection) in a queue
// group, so several dispatchers share it, with the default options. Stop
// it with Stop.
func ServeJS(nc *nats.Conn, prefix string) (*JSProxy, error) {
	return ServeJSWith(nc, prefix, ProxyOptions{})
}

// ServeJSWith is ServeJS with options.
func ServeJSWith(nc *nats.Conn, prefix string, o ProxyOptions) (*JSProxy, error) {
	if o.Upstream == "" {
		o.Upstream = "$JS.API"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.MaxPerTenant <= 0 {
		o.MaxPerTenant = 32
	}
	p := &JSProxy{nc: nc, prefix: prefix, stream: protocol.NewNames(prefix).QueriesStream(), opts: o, byTenant: map[string]int{}}
	sub, err := nc.QueueSubscribe(prefix+".tjs.*.>", "fleet-tjs", p.dispatch)
	if err != nil {
		return nil, fmt.Errorf("tenancy: serving the tenants' JetStream API: %w", err)
	}
	p.sub = sub
	return p, nil
}

// Stop drains the proxy's subscription and waits for the requests in
// flight (each bounded by the upstream timeout) or ctx.
func (p *JSProxy) Stop(ctx context.Context) error {
	closed := p.sub.StatusChanged(nats.SubscriptionClosed)
	if err := p.sub.Drain(); err == nil {
		select {
		case <-closed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dispatch hands m to a goroutine of its own, or refuses it as busy.
func (p *JSProxy) dispatch(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	rest, _ := strings.CutPrefix(m.Subject, p.prefix+".tjs.")
	tenant, call, _ := strings.Cut(rest, ".")
	if err := p.acquire(tenant); err != nil {
		_ = m.Respond(jsError(err))
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.release(tenant)
		p.serve(tenant, call, m)
	}()
}

func (p *JSProxy) acquire(tenant string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight >= p.opts.MaxInFlight {
		return fmt.Errorf("%w: %d requests in flight; retry", ErrBusy, p.inFlight)
	}
	if p.byTenant[tenant] >= p.opts.MaxPerTenant {
		return fmt.Errorf("%w: %d requests of tenant %s in flight; retry", ErrBusy, p.byTenant[tenant], tenant)
	}
	p.inFlight++
	p.byTenant[tenant]++
	return nil
}

func (p *JSProxy) release(tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	if p.byTenant[tenant]--; p.byTenant[tenant] <= 0 {
		delete(p.byTenant, tenant)
	}
}

func (p *JSProxy) serve(tenant, call string, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.Timeout)
	defer cancel()
	resp, err := p.forward(ctx, tenant, call, m.Data)
	if err != nil {
		_ = m.Respond(jsError(err))
		return
	}
	out := nats.NewMsg(m.Reply)
	out.Data, out.Header = resp.Data, resp.Header
	_ = m.RespondMsg(out)
}

// forward checks call ($JS.API.<call>, with body data) for tenant and
// sends the request it builds from the checked values.
func (p *JSProxy) forward(ctx context.Context, tenant, call string, data []byte) (*nats.Msg, error) {
	if ValidTenant(tenant) != nil {
		return nil, fmt.Errorf("%w: no tenant in the request's subject", ErrScope)
	}
	own := p.prefix + ".query." + tenant + "."
	var body []byte
	switch {
	case strings.HasPrefix(call, "CONSUMER.CREATE."+p.stream+"."):
		name, filter, _ := strings.Cut(strings.TrimPrefix(call, "CONSUMER.CREATE."+p.stream+"."), ".")
		cc, err := CheckConsumerCreate(p.stream, name, filter, own, data)
		if err != nil {
			return nil, err
		}
		call, body = cc.Subject(), cc.Body()
	case strings.HasPrefix(call, "CONSUMER.INFO."+p.stream+"."), strings.HasPrefix(call, "CONSUMER.DELETE."+p.stream+"."):
		op, name, _ := strings.Cut(strings.TrimPrefix(call, "CONSUMER."), "."+p.stream+".")
		if err := checkReaderName(name); err != nil {
			return nil, err
		}
		if err := checkEmpty("consumer "+strings.ToLower(op), data); err != nil {
			return nil, err
		}
		info, err := p.request(ctx, "CONSUMER.INFO."+p.stream+"."+name, nil)
		if err != nil {
			return nil, err
		}
		if notFound(info.Data) {
			return info, nil // the server's own answer: no such consumer
		}
		if !ownConsumer(info.Data, own) {
			return nil, fmt.Errorf("%w: consumer %q is not one of tenant %s's readers", ErrScope, name, tenant)
		}
		if op == "INFO" {
			return info, nil
		}
		call = "CONSUMER.DELETE." + p.stream + "." + name
	case call == "STREAM.MSG.GET."+p.stream, call == "DIRECT.GET."+p.stream:
		var err error
		if body, err = CheckMsgGet(own, data); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: $JS.API.%s", ErrScope, call)
	}
	return p.request(ctx, call, body)
}

// request sends the JetStream API call (after the prefix) upstream.
func (p *JSProxy) request(ctx context.Context, call string, body []byte) (*nats.Msg, error) {
	m, err := p.nc.RequestWithContext(ctx, p.opts.Upstream+"."+call, body)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return nil, fmt.Errorf("the fleet's JetStream API did not answer %s within %s", call, p.opts.Timeout)
	}
	return m, err
}

// ownConsumer reports whether a consumer info reply (the server's) is of
// an ephemeral, pull reader filtered within own.
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

// notFound reports whether a JetStream API reply is "consumer not found".
func notFound(data []byte) bool {
	var r struct {
		Error *struct {
			Code    int `json:"code"`
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	return json.Unmarshal(data, &r) == nil && r.Error != nil && r.Error.Code == 404 && r.Error.ErrCode == 10014
}

// jsError is a JetStream API error reply: 403 for a request a tenant may
// not make, 503 when busy or the upstream did not answer.
func jsError(err error) []byte {
	code := 503
	if errors.Is(err, ErrScope) {
		code = 403
	}
	b, _ := json.Marshal(map[string]any{
		"type":  "io.nats.jetstream.api.v1.error",
		"error": map[string]any{"code": code, "err_code": 10000, "description": err.Error()},
	})
	return b
}
