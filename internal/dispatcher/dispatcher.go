package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/schedule"
	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/tracing"
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
	// Tracing makes the dispatcher's spans (fleet.submit, and the
	// admitter's fleet.admit); nil is off.
	Tracing *tracing.Tracing
	// GitHub is the GitHub App whose webhooks start jobs (POST /v1/github)
	// and which reports back on them; nil = none.
	GitHub *github.App
	// PublicURL is the dashboard's base URL, linked from GitHub comments.
	PublicURL string
	// GitHubBackoff are the waits before retries of a report GitHub did
	// not take; nil = github.DefaultBackoff.
	GitHubBackoff []time.Duration
}

// part is one of the Service's parts: started in the order of
// Service.parts, stopped in the reverse order.
type part struct {
	name  string
	start func(context.Context) error
	stop  func(context.Context) error
}

// Service is the dispatcher service. It owns its parts: it builds them in
// New, starts them in Start and stops them in Stop; its owner (the
// command) starts and stops the Service alone.
type Service struct {
	startstop.Base

	cfg   Config
	names protocol.Names
	js    jetstream.JetStream
	log   zerolog.Logger

	adm      *admission.Admitter
	index    *statusIndex
	dead     *deadLetters
	sessions *sessions
	api      *api
	micro    *endpoints
	tenants  *tenantAPI
	sched    *schedules

	// parts in start order; started are those running (Start and Stop
	// alone touch it, one at a time: startstop serialises them).
	parts   []part
	started []part
}

// New returns a Service and builds its parts.
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
	if ac.Tracing == nil {
		ac.Tracing = cfg.Tracing
	}
	pc := cfg.Provision.WithDefaults()
	ac.Policy.FleetCap, ac.Replicas = pc.MaxConcurrency, pc.Replicas
	adm, err := admission.New(ac)
	if err != nil {
		return nil, err
	}
	s := &Service{
		Base: startstop.Base{Name: "dispatcher"},
		cfg:  cfg, names: cfg.Provision.Names, js: js,
		log: cfg.Logger.With().Str("component", "dispatcher").Logger(),
		adm: adm,
	}
	s.build(pc.MaxConcurrency)
	return s, nil
}

// build makes the parts and lists them in start order: the consumers,
// then the API that reads what they keep, then the admitter. Stop goes
// the other way: the admitter hands its lease over at once, the API takes
// no more requests, and the index writer ends last, after the batch it
// holds.
func (s *Service) build(fleetCap int) {
	q := queryDeps{nc: s.cfg.NC, js: s.js, names: s.names, statusStore: s.cfg.Status, objects: s.cfg.Objects, log: s.log, tracing: s.cfg.Tracing}
	s.sessions = newSessions(q, s.cfg.SessionTTL, s.cfg.SessionSweep)
	s.index = newStatusIndex(q, s.sessions, s.adm)
	end := &ender{queryDeps: q}
	s.dead = &deadLetters{queryDeps: q, index: s.index, end: end}
	queued := &queuedCancel{queryDeps: q, index: s.index, end: end, fleetCap: fleetCap}
	s.sessions.queued = queued
	s.api = &api{queryDeps: q, index: s.index, sessions: s.sessions, dead: s.dead, queued: queued}
	s.api.scheduleStore = schedule.NewStore(s.js, s.names, s.cfg.Provision.WithDefaults().Replicas)
	s.api.triggers = trigger.NewStore(s.js, s.names, s.cfg.Provision.WithDefaults().Replicas)
	s.api.githubRules = github.NewStore(s.js, s.names, s.cfg.Provision.WithDefaults().Replicas)
	s.sched = &schedules{store: s.api.scheduleStore, firer: schedule.NewFirer(s.js, s.names, s.api.submitFired, s.log)}
	s.micro = &endpoints{nc: s.cfg.NC, names: s.names, api: s.api}
	s.tenants = &tenantAPI{nc: s.cfg.NC, names: s.names, api: s.api, log: s.log}
	s.parts = []part{
		{"status index", s.index.start, s.index.stop},
		{"dead letters", s.dead.start, s.dead.stop},
		{"sessions", s.sessions.start, s.sessions.stop},
		{"api", s.micro.start, s.micro.stop},
		{"tenant api", s.tenants.start, s.tenants.stop},
		{"schedules", s.sched.start, s.sched.stop},
		{"triggers", s.api.triggers.Ensure, func(context.Context) error { return nil }},
		{"github rules", s.api.githubRules.Ensure, func(context.Context) error { return nil }},
		s.githubReporter(),
		// The admitter stays last: a stopped admitter does not start
		// again, so no part that can fail to start may follow it.
		{"admitter", s.adm.Start, s.adm.Stop},
	}
}

// Admitter is the dispatcher's admitter, one of its parts.
func (s *Service) Admitter() *admission.Admitter { return s.adm }

// Admitting reports whether this dispatcher is the one admitting jobs.
func (s *Service) Admitting() bool { return s.adm.Leading() }

// Ready reports whether the service has provisioned and serves.
func (s *Service) Ready() bool { return s.Running() && s.cfg.NC.IsConnected() }

// Start provisions the streams and starts the parts. It returns once
// serving. A Start that fails stops the parts it started, so it may be
// called again; a second Start, or one after Stop, is refused
// (startstop).
func (s *Service) Start(ctx context.Context) error { return s.Base.Start(ctx, s.start) }

// Stop stops the parts in the reverse order of Start; in-flight handlers
// and the index batch being written finish first. Safe to call twice,
// and before or after a failed Start.
func (s *Service) Stop(ctx context.Context) error { return s.Base.Stop(ctx, s.halt) }

func (s *Service) start(ctx context.Context) error {
	if err := provision.Streams(ctx, s.js, s.cfg.Provision); err != nil {
		return err
	}
	for _, p := range s.parts {
		if err := p.start(ctx); err != nil {
			_ = s.halt(context.Background())
			return err
		}
		s.started = append(s.started, p)
	}
	s.log.Info().Str("jobs", s.names.JobsStream()).Str("queries", s.names.QueriesStream()).Msg("dispatcher serving")
	return nil
}

// halt stops the parts started, last first, and leaves none started.
func (s *Service) halt(ctx context.Context) error {
	var errs []error
	for i := len(s.started) - 1; i >= 0; i-- {
		p := s.started[i]
		if err := p.stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("dispatcher: stopping the %s: %w", p.name, err))
		}
	}
	s.started = nil
	return errors.Join(errs...)
}

// githubReporter is the part that reports GitHub-started jobs back to
// GitHub; a part that does nothing without a GitHub App.
func (s *Service) githubReporter() part {
	if s.cfg.GitHub == nil {
		nop := func(context.Context) error { return nil }
		return part{"github reporter", nop, nop}
	}
	r := &github.Reporter{App: s.cfg.GitHub, Rules: s.api.githubRules, JS: s.js, Names: s.names,
		PublicURL: s.cfg.PublicURL, Log: s.log, Backoff: s.cfg.GitHubBackoff}
	return part{"github reporter", r.Start, r.Stop}
}
