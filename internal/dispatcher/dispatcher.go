package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Durable consumer names of the dispatcher.
const (
	StatusConsumer = "dispatcher-status"
	DLQConsumer    = "dispatcher-dlq"
	queueGroup     = "fleet-dispatcher"
)

// Config configures the Service.
type Config struct {
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// Provision configures streams and the consumer; its Names are the
	// service's names.
	Provision provision.Config
	// Status stores status records (the index). Required.
	Status storage.Store
	// Objects stores transcripts (dead letters add their synthetic result).
	// Required.
	Objects storage.Store
	// SessionTTL ends a session parked for longer (succeeded); 0 = 7 days.
	SessionTTL time.Duration
	// SessionSweep is how often parked sessions are checked against
	// SessionTTL; 0 = min(SessionTTL/10, 1m).
	SessionSweep time.Duration
	// Logger; nil is Nop.
	Logger *zerolog.Logger
	// Admission configures the admitter; the service fills in its
	// connection, names, logger and fleet cap (Provision.MaxConcurrency).
	Admission admission.Config
}

// Service is the dispatcher service.
type Service struct {
	cfg   Config
	names protocol.Names
	js    jetstream.JetStream
	log   zerolog.Logger

	// lifecycle serialises Start and Stop.
	lifecycle sync.Mutex
	started   bool

	mu       sync.Mutex
	subs     []*nats.Subscription
	api      micro.Service // the API endpoints (micro.go)
	consumes []jetstream.ConsumeContext
	ready    bool
	stopped  bool
	// sweep stops the parked-session expiry loop (sessions.go).
	sweepStop func()

	indexDone chan struct{} // closed when the index loop has returned

	admCfg   admission.Config
	admitter *admission.Admitter // one per successful start

	// testBeforeEnd, in tests, runs between reading a dead-lettered
	// query's status and ending it (the window a worker can write in).
	testBeforeEnd func()
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil || cfg.Status == nil || cfg.Objects == nil {
		return nil, errors.New("dispatcher: NC, Status and Objects are required")
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	ac := cfg.Admission
	ac.JS, ac.NC, ac.Names, ac.Logger = js, cfg.NC, cfg.Provision.Names, cfg.Logger
	pc := cfg.Provision.WithDefaults()
	ac.Policy.FleetCap, ac.Replicas = pc.MaxConcurrency, pc.Replicas
	if _, err := admission.New(ac); err != nil { // validates
		return nil, err
	}
	return &Service{
		cfg: cfg, names: cfg.Provision.Names, js: js,
		log:    cfg.Logger.With().Str("component", "dispatcher").Logger(),
		admCfg: ac,
	}, nil
}

// Admitter is the running admitter (nil before Start or after Stop).
func (s *Service) Admitter() *admission.Admitter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitter
}

// Admitting reports whether this dispatcher is the one admitting jobs.
func (s *Service) Admitting() bool {
	a := s.Admitter()
	return a != nil && a.Leading()
}

// Ready reports whether the service has provisioned and serves.
func (s *Service) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready && !s.stopped && s.cfg.NC.IsConnected()
}

// Start provisions the streams and starts serving. It returns once serving.
// A Start that fails undoes what it began (subscriptions, consumers, the
// index loop), so it may be called again; a Start after one that succeeded,
// or after Stop, returns an error.
func (s *Service) Start(ctx context.Context) error {
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	s.mu.Lock()
	started, stopped := s.started, s.stopped
	s.mu.Unlock()
	switch {
	case started:
		return errors.New("dispatcher: already started")
	case stopped:
		return errors.New("dispatcher: stopped")
	}
	if err := s.start(ctx); err != nil {
		_ = s.halt(context.Background())
		return err
	}
	s.mu.Lock()
	s.started, s.ready = true, true
	s.mu.Unlock()
	s.log.Info().Str("jobs", s.names.JobsStream()).Str("queries", s.names.QueriesStream()).Msg("dispatcher serving")
	return nil
}

func (s *Service) start(ctx context.Context) error {
	if err := provision.Streams(ctx, s.js, s.cfg.Provision); err != nil {
		return err
	}
	n := s.names
	svc, err := s.serveAPI()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.api = svc
	s.mu.Unlock()
	idx, err := provision.Consumer(ctx, s.js, n.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       StatusConsumer,
		FilterSubject: n.StatusWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1024,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: status index consumer: %w", err)
	}
	// The index handler only queues; one goroutine drains the queue in
	// batches and writes each query's newest event once per batch, so a
	// busy fleet costs one storage write per query per batch, not one per
	// event.
	indexQ, indexDone := make(chan jetstream.Msg, 1024), make(chan struct{})
	cc, err := idx.Consume(func(m jetstream.Msg) { indexQ <- m }, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("dispatcher: status index: %w", err)
	}
	s.mu.Lock()
	s.consumes = append(s.consumes, cc)
	s.indexDone = indexDone
	s.mu.Unlock()
	go s.indexLoop(cc, indexQ, indexDone)
	dlq, err := provision.Consumer(ctx, s.js, n.AdvisoryStream(), jetstream.ConsumerConfig{
		Durable:       DLQConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       time.Minute,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: dead-letter consumer: %w", err)
	}
	cc, err = dlq.Consume(s.deadLetter, jetstream.PullMaxMessages(16))
	if err != nil {
		return fmt.Errorf("dispatcher: dead letters: %w", err)
	}
	s.mu.Lock()
	s.consumes = append(s.consumes, cc)
	s.mu.Unlock()
	if err := s.startSessions(ctx); err != nil {
		return err
	}
	if err := s.serveTenants(); err != nil {
		return err
	}
	adm, err := admission.New(s.admCfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.admitter = adm
	s.mu.Unlock()
	return adm.Start(ctx)
}

// Stop stops serving; in-flight handlers and the index batch being written
// finish first. Safe to call twice, and before or after a failed Start.
func (s *Service) Stop(ctx context.Context) error {
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	return s.halt(ctx)
}

// halt drains the subscriptions and consumers Start made and waits for the
// index loop; it leaves the service with none.
func (s *Service) halt(ctx context.Context) error {
	s.mu.Lock()
	subs, consumes, indexDone, api, sweepStop, adm := s.subs, s.consumes, s.indexDone, s.api, s.sweepStop, s.admitter
	s.subs, s.consumes, s.indexDone, s.ready, s.api, s.sweepStop, s.admitter = nil, nil, nil, false, nil, nil, nil
	s.mu.Unlock()
	// The admitter first: it hands its lease over at once.
	if adm != nil {
		if err := adm.Stop(ctx); err != nil {
			return err
		}
	}
	if sweepStop != nil {
		sweepStop()
	}
	if api != nil {
		_ = api.Stop() // drains the endpoints' subscriptions
	}
	for _, sub := range subs {
		_ = sub.Drain()
	}
	for _, cc := range consumes {
		cc.Drain()
	}
	for _, cc := range consumes {
		select {
		case <-cc.Closed():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The index writer last: it ends once its consumer is closed, after
	// writing the batch it holds.
	if indexDone != nil {
		select {
		case <-indexDone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
