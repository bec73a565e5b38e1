package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
)

// Defaults of Config.
const (
	DefaultBackoff  = 5 * time.Second
	MaxBackoff      = time.Hour
	RetryFor        = 24 * time.Hour
	DefaultInFlight = 4
	DefaultTimeout  = 15 * time.Second
	DefaultSweep    = time.Minute
	// ConsumerName is the durable consumer on the status subjects.
	ConsumerName = "webhooks"
	// queueSize is an endpoint's in-memory queue; past it, deliveries
	// wait in the bucket for the sweeper.
	queueSize = 1024
	// keepDeliveries is how long delivery records are kept.
	keepDeliveries = 7 * 24 * time.Hour
)

// Config configures the service.
type Config struct {
	NC    *nats.Conn
	Names protocol.Names
	// Backoff is the first retry's delay, doubling up to MaxBackoff
	// (--webhook-backoff); 0 = DefaultBackoff.
	Backoff time.Duration
	// AllowPrivate allows receivers on loopback, private and link-local
	// addresses (--webhook-allow-private).
	AllowPrivate bool
	// InFlight bounds each endpoint's requests at once; 0 = DefaultInFlight.
	InFlight int
	// Timeout bounds one attempt; 0 = DefaultTimeout.
	Timeout time.Duration
	// Sweep is how often due deliveries not in hand are picked up; 0 =
	// DefaultSweep.
	Sweep time.Duration
	// RetryFor is how long a delivery is retried; 0 = RetryFor (24h).
	RetryFor time.Duration
	// Replicas of the buckets; 0 = 1.
	Replicas int
	// Lookup resolves a URL's host at add (nil: the system resolver).
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// Now is the clock; nil = time.Now.
	Now    func() time.Time
	Logger *zerolog.Logger
}

// Service delivers webhooks and serves the webhook API.
type Service struct {
	startstop.Base
	cfg       Config
	log       zerolog.Logger
	js        jetstream.JetStream
	endpoints jetstream.KeyValue
	delivs    jetstream.KeyValue
	client    *http.Client

	mu      sync.Mutex
	byTen   map[string]map[string]Endpoint // tenant → id → endpoint
	senders map[string]*sender             // endpoint key → sender
	pending map[string]bool                // delivery keys in hand (queued, in flight, scheduled)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	cons   jetstream.Consumer
	// cc consumes status events while some endpoint exists (consumeLocked);
	// under mu, like stopped.
	cc      jetstream.ConsumeContext
	stopped bool
	subs    []*nats.Subscription
	watch   jetstream.KeyWatcher
}

// New returns a service; Start begins it.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil {
		return nil, errors.New("webhook: NC is required")
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = DefaultInFlight
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Sweep <= 0 {
		cfg.Sweep = DefaultSweep
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = RetryFor
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: dialControl(cfg.AllowPrivate)}
	tr := &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: cfg.InFlight, IdleConnTimeout: time.Minute,
		TLSHandshakeTimeout: cfg.Timeout, ResponseHeaderTimeout: cfg.Timeout}
	s := &Service{cfg: cfg, log: cfg.Logger.With().Str("component", "webhook").Logger(), js: js,
		client: &http.Client{Transport: tr, Timeout: cfg.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		byTen: map[string]map[string]Endpoint{}, senders: map[string]*sender{}, pending: map[string]bool{}}
	s.Name = "webhook"
	return s, nil
}

// EndpointsBucket and DeliveriesBucket name the service's KV buckets.
func EndpointsBucket(n protocol.Names) string {
	return n.QueriesStream()[:len(n.QueriesStream())-len("_QUERIES")] + "_WEBHOOKS"
}
func DeliveriesBucket(n protocol.Names) string { return EndpointsBucket(n) + "_DELIVERIES" }

// Start opens the buckets, loads and watches the endpoints, serves the API,
// starts the sweeper and consumes status events.
func (s *Service) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(ctx context.Context) error {
		if err := s.start(ctx); err != nil {
			s.stop()
			return err
		}
		return nil
	})
}

func (s *Service) start(ctx context.Context) error {
	var err error
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.endpoints, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: EndpointsBucket(s.cfg.Names),
		Description: "webhook endpoints per tenant", History: 1, Replicas: s.cfg.Replicas})
	if err != nil {
		return fmt.Errorf("webhook: the endpoints bucket: %w", err)
	}
	s.delivs, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: DeliveriesBucket(s.cfg.Names),
		Description: "webhook deliveries and their attempts", History: 1, TTL: keepDeliveries, Replicas: s.cfg.Replicas})
	if err != nil {
		return fmt.Errorf("webhook: the deliveries bucket: %w", err)
	}
	if err := s.watchEndpoints(ctx); err != nil {
		return err
	}
	if err := s.serveAPI(); err != nil {
		return err
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.cfg.Names.QueriesStream(), jetstream.ConsumerConfig{
		Durable: ConsumerName, Description: "webhook deliveries of status events",
		FilterSubject: s.cfg.Names.StatusWildcard(), DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1024, Replicas: s.cfg.Replicas})
	if err != nil {
		return fmt.Errorf("webhook: the status consumer: %w", err)
	}
	s.mu.Lock()
	s.cons = cons
	err = s.consumeLocked()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.wg.Go(s.sweepLoop)
	return nil
}

// consumeLocked consumes status events while some endpoint exists, and
// stops while none does: with no endpoint every event would be read,
// decoded and acked for nothing (two deliveries and two acks per job). The
// durable consumer keeps its place meanwhile, so the events of a pause are
// read when an endpoint comes (and skipped by matching: they predate it).
// Called with mu held.
func (s *Service) consumeLocked() error {
	if s.cons == nil || s.stopped {
		return nil
	}
	n := 0
	for _, m := range s.byTen {
		n += len(m)
	}
	switch {
	case n > 0 && s.cc == nil:
		cc, err := s.cons.Consume(s.onStatus)
		if err != nil {
			return fmt.Errorf("webhook: consuming status events: %w", err)
		}
		s.cc = cc
	case n == 0 && s.cc != nil:
		s.cc.Stop()
		s.cc = nil
	}
	return nil
}

// Stop stops consuming and delivering; deliveries under way are cut short
// and retried by the next service.
func (s *Service) Stop(ctx context.Context) error {
	return s.Base.Stop(ctx, func(ctx context.Context) error {
		s.stop()
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		select {
		case <-done:
			s.client.CloseIdleConnections()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

func (s *Service) stop() {
	s.mu.Lock()
	s.stopped = true
	if s.cc != nil {
		s.cc.Stop()
		s.cc = nil
	}
	s.mu.Unlock()
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	if s.watch != nil {
		_ = s.watch.Stop()
	}
	// Cancelled under mu: senderFor (which starts goroutines) holds it and
	// checks the context, so none starts once Stop waits for them.
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	for _, sd := range s.senders {
		sd.close()
	}
	s.mu.Unlock()
}

// watchEndpoints keeps byTen in step with the endpoints bucket.
func (s *Service) watchEndpoints(ctx context.Context) error {
	w, err := s.endpoints.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("webhook: watching endpoints: %w", err)
	}
	// The initial values end with a nil entry; wait for it so Start
	// returns with every endpoint known.
	for e := range w.Updates() {
		if e == nil {
			break
		}
		s.applyEndpoint(e)
	}
	s.watch = w
	s.wg.Go(func() {
		for e := range w.Updates() {
			if e != nil {
				s.applyEndpoint(e)
			}
		}
	})
	return nil
}

func (s *Service) applyEndpoint(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if err := s.consumeLocked(); err != nil {
			s.log.Error().Err(err).Msg("status events are not consumed; deliveries wait for the next endpoint change or restart")
		}
	}()
	if e.Operation() != jetstream.KeyValuePut {
		for t, m := range s.byTen {
			for id := range m {
				if endpointKey(t, id) == e.Key() {
					delete(m, id)
				}
			}
		}
		if sd := s.senders[e.Key()]; sd != nil {
			sd.close()
			delete(s.senders, e.Key())
		}
		return
	}
	var ep Endpoint
	if json.Unmarshal(e.Value(), &ep) != nil {
		return
	}
	if s.byTen[ep.Tenant] == nil {
		s.byTen[ep.Tenant] = map[string]Endpoint{}
	}
	s.byTen[ep.Tenant][ep.ID] = ep
}

// matching returns the tenant's endpoints that want state s and existed
// at time at.
func (s *Service) matching(tenant string, st protocol.State, at time.Time) []Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Endpoint
	for _, ep := range s.byTen[tenant] {
		if ep.Wants(st) && !at.Before(ep.Created) {
			out = append(out, ep)
		}
	}
	return out
}

// onStatus records a delivery per matching endpoint, then acks; a record
// that could not be written naks the event for a retry (records already
// written are found again by their webhook-id).
func (s *Service) onStatus(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	var ev protocol.StatusEvent
	if json.Unmarshal(m.Data(), &ev) != nil || !protocol.ValidTenant(ev.Tenant) || !protocol.ValidID(ev.ID) {
		_ = m.Ack()
		return
	}
	eps := s.matching(ev.Tenant, ev.State, md.Timestamp)
	if len(eps) == 0 {
		_ = m.Ack()
		return
	}
	body, err := json.Marshal(Payload{Type: "query." + string(ev.State), Timestamp: ev.At, Data: ev})
	if err != nil {
		_ = m.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	var keys []string
	for _, ep := range eps {
		d := Delivery{WebhookID: webhookID(ep.ID, md.Sequence.Stream), Tenant: ev.Tenant, Endpoint: ep.ID, QueryID: ev.ID,
			Type: "query." + string(ev.State), Created: s.cfg.Now().UTC(), Body: body, NextRetry: s.cfg.Now().UTC()}
		key := deliveryKey(d.Tenant, d.Endpoint, d.WebhookID)
		b, _ := json.Marshal(d)
		if _, err := s.delivs.Create(ctx, key, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			s.log.Warn().Err(err).Str("tenant", ev.Tenant).Str("endpoint", ep.ID).Msg("recording a delivery; will retry")
			_ = m.NakWithDelay(time.Second)
			return
		}
		keys = append(keys, key)
	}
	_ = m.Ack()
	for i, key := range keys {
		s.enqueue(endpointKey(ev.Tenant, eps[i].ID), key)
	}
}
