package main

// `dispatcher serve`: parse the flags (flags.go), check them, build the
// services, run them until a signal.
//
// Ownership: the command owns the top-level services. It builds the
// dispatcher (which owns its own parts: status index, dead letters,
// sessions, API, admitter), the archiver, and the HTTP and pprof servers;
// it starts them in that order and stops them in the reverse order. No
// service starts or stops another the command built.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/archiver"
	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/dashboard"
	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/httpserve"
	"github.com/agentfleet/agentfleet/internal/pprofserve"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	_ "github.com/agentfleet/agentfleet/pkg/storage/backends/all" // s3:// and cfkv://
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// serve runs `dispatcher serve`: parse and check the flags, build, run.
func serve(ctx context.Context, stop context.CancelFunc, args []string, stdio fleetcli.IO) int {
	cfg, code, ok := parseServe(args, stdio)
	if !ok {
		return code
	}
	log, err := config.Logger(cfg.common, stdio.Err)
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return fleetcli.ExitUsage
	}
	config.ExitOnSecondSignal(ctx, stop, log)
	s := &server{cfg: cfg, log: log}
	if s.tracing, err = tracing.Start(ctx, "fleet-dispatcher", log); err != nil {
		fmt.Fprintln(stdio.Err, "dispatcher serve:", err)
		return fleetcli.ExitUsage
	}
	// Last: the services that make spans have stopped.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.tracing.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Uint64("dropped_spans", s.tracing.Dropped()).Msg("tracing: flushing spans at exit")
		}
	}()
	defer s.close()
	if code, err := s.build(ctx, stop); err != nil {
		log.Error().Err(err).Msg("starting")
		return code
	}
	return s.run(ctx)
}

// parseServe reads the flags and checks them; !ok means exit with code
// (0 after --help).
func parseServe(args []string, stdio fleetcli.IO) (cfg serveConfig, code int, ok bool) {
	fs := pflag.NewFlagSet("dispatcher serve", pflag.ContinueOnError)
	cfg.flags(fs)
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return cfg, 0, false
		}
		fmt.Fprintln(stdio.Err, err)
		return cfg, fleetcli.ExitUsage, false
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stdio.Err, "dispatcher serve:", err)
		return cfg, fleetcli.ExitUsage, false
	}
	return cfg, 0, true
}

// server is what `dispatcher serve` built: the connection, the stores and
// the services it owns.
type server struct {
	cfg     serveConfig
	log     zerolog.Logger
	nc      *nats.Conn
	lost    func() error     // the connection's loss, if it was lost for good
	tracing *tracing.Tracing // from OTEL_*

	objects, status storage.Store
	disp            *dispatcher.Service
	arch            *archiver.Service
	hooks           *webhook.Service
	reg             *prometheus.Registry
	ui              http.Handler
	http            *httpserve.Server
	pprof           *pprofserve.Server
}

// build connects, opens the stores and builds the services, the metrics
// and the dashboard; it returns the exit code of whatever failed.
func (s *server) build(ctx context.Context, stop context.CancelFunc) (int, error) {
	c, names := s.cfg, protocol.NewNames(s.cfg.common.Prefix)
	nc, js, err := config.ConnectJetStream(c.common, "fleet-dispatcher", s.log)
	if err != nil {
		return 1, err
	}
	s.nc, s.lost = nc, config.StopOnClosedConnection(nc, s.log, stop)
	// nats:// buckets follow --replicas, so on a cluster they survive a
	// node as the streams do. Opening is retried as provisioning is: a
	// young cluster may not be able to place a replicated bucket yet. The
	// retries are bounded, so a store that stays away fails the start.
	deps := backends.Deps{JS: js, StatusBucket: names.StatusBucket(), ObjectBucket: names.ObjectBucket(), Replicas: c.replicas, Logger: &s.log}
	octx, ocancel := context.WithTimeout(ctx, 2*time.Minute)
	err = provision.Retry(octx, func(ctx context.Context) (err error) {
		s.objects, s.status, err = backends.OpenBoth(ctx, c.storageURL, c.statusURL, deps)
		return err
	})
	ocancel()
	if err != nil {
		return 1, fmt.Errorf("opening --storage / --status-storage: %w", err)
	}
	dc := c.dispatcher(nc, s.status, s.objects, &s.log)
	dc.Tracing = s.tracing
	if dc.GitHub, err = c.githubApp(); err != nil {
		return 1, err
	}
	if dc.PublicURL == "" && c.httpAddr != "" {
		dc.PublicURL = "http://" + c.httpAddr
	}
	if s.disp, err = dispatcher.New(dc); err != nil {
		return 1, fmt.Errorf("dispatcher: %w", err)
	}
	// The archiver completes finished queries' transcripts from the stream
	// (a lost worker's unflushed tail, lines a full journal could not take).
	if s.arch, err = archiver.New(archiver.Config{NC: nc, Names: names, Store: s.objects, Logger: &s.log}); err != nil {
		return 1, fmt.Errorf("archiver: %w", err)
	}
	return s.metrics(nc, names)
}

// run starts the services in order, serves until ctx ends, then stops
// them in the reverse order.
func (s *server) run(ctx context.Context) int {
	defer s.shutdown()
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := s.disp.Start(sctx)
		cancel()
		if err == nil {
			break
		}
		s.log.Warn().Err(err).Msg("starting the dispatcher; retrying")
		select {
		case <-ctx.Done():
			return s.exit()
		case <-time.After(2 * time.Second):
		}
	}
	if err := s.arch.Start(ctx); err != nil {
		s.log.Error().Err(err).Msg("starting the archiver")
		return 1
	}
	hooks, err := startWebhooks(ctx, s.nc, protocol.NewNames(s.cfg.common.Prefix), s.cfg.hooks, s.cfg.replicas, &s.log)
	if err != nil {
		if ctx.Err() != nil { // told to stop while starting: a shutdown, not a failure
			s.log.Info().Msg("shutting down")
			return s.exit()
		}
		s.log.Error().Err(err).Msg("starting webhooks")
		return 1
	}
	s.hooks = hooks
	if err := s.listen(); err != nil {
		s.log.Error().Err(err).Msg("listening")
		return 1
	}
	<-ctx.Done()
	s.log.Info().Msg("shutting down")
	return s.exit()
}

// shutdown stops what run started, last first, within 30s.
func (s *server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.http != nil {
		_ = s.http.Stop(ctx)
	}
	if s.pprof != nil {
		_ = s.pprof.Stop(ctx)
	}
	if s.hooks != nil {
		if err := s.hooks.Stop(ctx); err != nil {
			s.log.Warn().Err(err).Msg("stopping webhooks")
		}
	}
	if err := s.arch.Stop(ctx); err != nil {
		s.log.Warn().Err(err).Msg("stopping the archiver")
	}
	if err := s.disp.Stop(ctx); err != nil {
		s.log.Warn().Err(err).Msg("stopping the dispatcher")
	}
}

// metrics builds the registry /metrics serves (Go, process and queue
// collectors) and the dashboard.
func (s *server) metrics(nc *nats.Conn, names protocol.Names) (int, error) {
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	queue, err := queueMetrics(nc, names, s.cfg.workerSlots, s.cfg.tenantDefaults)
	if err != nil {
		return fleetcli.ExitUsage, fmt.Errorf("--worker-slots: %w", err)
	}
	s.reg.MustRegister(queue)
	// The dashboard and /v1 call the dispatcher's API in-process: its
	// creds serve <prefix>.api.>, they may not publish there.
	queue.Client().Local = s.disp.Local()
	tenants, err := tenantTokens(s.cfg.authDir)
	if err != nil {
		return fleetcli.ExitUsage, fmt.Errorf("--auth-dir: %w", err)
	}
	ui, err := dashboard.New(dashboard.Config{Client: queue.Client(), Queue: queue, Token: s.cfg.uiToken, Tenants: tenants, Objects: s.objects, Status: s.status, Logger: &s.log})
	if err != nil {
		return 1, fmt.Errorf("dashboard: %w", err)
	}
	s.ui, err = withAPI(queue.Client(), s.status, s.objects, s.cfg.uiToken, tenants, ui, &s.log)
	if err != nil {
		return 1, fmt.Errorf("http api: %w", err)
	}
	s.ui = s.disp.Inbound(s.ui)
	return 0, nil
}

// listen starts the HTTP server (/healthz, /readyz, /metrics, the
// dashboard) and the pprof one.
func (s *server) listen() (err error) {
	s.http, err = httpserve.StartWithUI(s.cfg.httpAddr, func() error {
		if s.disp.Ready() {
			return nil
		}
		return errors.New("not ready")
	}, s.reg, s.ui, s.log)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	if s.pprof, err = pprofserve.Start(s.cfg.pprofAddr, s.log); err != nil {
		return fmt.Errorf("--pprof: %w", err)
	}
	return nil
}

// close closes the stores and drains the connection, whatever was opened.
func (s *server) close() {
	if s.objects != nil {
		_ = s.objects.Close()
		_ = s.status.Close()
	}
	if s.nc != nil {
		_ = s.nc.Drain()
	}
}

// exit is the exit code: 1 when the connection was lost for good.
func (s *server) exit() int {
	if s.lost() != nil {
		return 1
	}
	return 0
}
