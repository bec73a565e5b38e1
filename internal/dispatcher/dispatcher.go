package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

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
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Service is the dispatcher service.
type Service struct {
	cfg   Config
	names protocol.Names
	js    jetstream.JetStream
	log   zerolog.Logger

	mu       sync.Mutex
	subs     []*nats.Subscription
	consumes []jetstream.ConsumeContext
	ready    bool
	stopped  bool

	indexQ    chan jetstream.Msg
	indexDone chan struct{}
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
	return &Service{
		cfg: cfg, names: cfg.Provision.Names, js: js,
		log: cfg.Logger.With().Str("component", "dispatcher").Logger(),
	}, nil
}

// Ready reports whether the service has provisioned and serves.
func (s *Service) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready && !s.stopped && s.cfg.NC.IsConnected()
}

// Start provisions the streams and starts serving. It returns once serving.
func (s *Service) Start(ctx context.Context) error {
	if err := provision.Streams(ctx, s.js, s.cfg.Provision); err != nil {
		return err
	}
	n := s.names
	handlers := map[string]nats.MsgHandler{
		n.APISubmit(): s.handleSubmit,
		n.APICancel(): s.handleCancel,
		n.APIStatus(): s.handleStatus,
		n.APIList():   s.handleList,
	}
	for subj, h := range handlers {
		sub, err := s.cfg.NC.QueueSubscribe(subj, queueGroup, h)
		if err != nil {
			return fmt.Errorf("dispatcher: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	idx, err := s.js.CreateOrUpdateConsumer(ctx, n.QueriesStream(), jetstream.ConsumerConfig{
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
	s.indexQ = make(chan jetstream.Msg, 1024)
	s.indexDone = make(chan struct{})
	cc, err := idx.Consume(func(m jetstream.Msg) { s.indexQ <- m }, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("dispatcher: status index: %w", err)
	}
	s.consumes = append(s.consumes, cc)
	go s.indexLoop(cc)
	dlq, err := s.js.CreateOrUpdateConsumer(ctx, n.AdvisoryStream(), jetstream.ConsumerConfig{
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
	s.consumes = append(s.consumes, cc)
	s.mu.Lock()
	s.ready = true
	s.mu.Unlock()
	s.log.Info().Str("jobs", n.JobsStream()).Str("queries", n.QueriesStream()).Msg("dispatcher serving")
	return nil
}

// Stop stops serving; in-flight handlers finish. Safe to call twice.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	subs, consumes := s.subs, s.consumes
	s.mu.Unlock()
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
	if s.indexDone != nil {
		select {
		case <-s.indexDone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
