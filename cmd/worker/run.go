package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/httpserve"
	"github.com/agentfleet/agentfleet/internal/pprofserve"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// run is the worker command: parse, validate, connect and build, serve
// until a signal, a drain request or idleness, stop.
func run(ctx context.Context, stop context.CancelFunc, args []string) int {
	o, code, ok := parse(args)
	if !ok {
		return code
	}
	log, err := config.Logger(o.common, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	config.ExitOnSecondSignal(ctx, stop, log)
	if err := o.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		return 2
	}
	if code, err := o.contain.check(o.sbName, log); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		return code
	}
	if o.tracing, err = tracing.Start(ctx, "fleet-worker", log); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		return 2
	}
	// Last: every span of the runs has ended.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := o.tracing.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Uint64("dropped_spans", o.tracing.Dropped()).Msg("tracing: flushing spans at exit")
		}
	}()
	log.Info().Str("nats_url", config.RedactURLs(o.common.NATSURL)).Msg("connecting to NATS")
	nc, js, err := config.ConnectJetStream(o.common, "fleet-worker", log)
	if err != nil {
		log.Error().Err(err).Msg("starting")
		return 1
	}
	defer func() { _ = nc.Drain() }()
	lost := config.StopOnClosedConnection(nc, log, stop)
	p, err := build(ctx, o, nc, js, log)
	if err != nil {
		var be *buildError
		if errors.As(err, &be) {
			log.Error().Err(be.err).Msg(be.what)
			return be.code
		}
		log.Error().Err(err).Msg("starting")
		return 1
	}
	defer p.objects.Close()
	// After serve: the worker's runs have ended (it stopped), so no
	// token is open any more.
	defer stopGateway(p.gw, log)
	// After serve too: the worker stopped, so no job takes a tree.
	defer stopRepoCache(p.repos, log)
	if code := serve(ctx, o, p, log); code != 0 {
		return code
	}
	if lost() != nil {
		return 1
	}
	return 0
}

// serve starts the worker with its HTTP endpoints and its operations
// (discovery, drain, --exit-if-idle), waits until one of them or a signal
// ends it, then stops it gracefully: running jobs get --shutdown-grace.
func serve(ctx context.Context, o *options, p *parts, log zerolog.Logger) int {
	hs, err := httpserve.StartWithReason(o.httpAddr, p.w.NotReady, p.reg, log)
	if err != nil {
		log.Error().Err(err).Msg("--http")
		return 1
	}
	ps, err := pprofserve.Start(o.pprofAddr, log)
	if err != nil {
		log.Error().Err(err).Msg("--pprof")
		return 1
	}
	defer func() { _ = ps.Stop(context.Background()) }()
	if err := p.w.Start(ctx); err != nil {
		log.Error().Err(err).Msg("starting")
		return 1
	}
	logStarted(o, p, log)
	ops, err := startOps(ctx, p.nc, p.names, p.w, o.exitIfIdle, log)
	if err != nil {
		log.Error().Err(err).Msg("discovery")
		return 1
	}
	defer ops.stop()
	<-ops.done()
	log.Info().Dur("grace", o.grace).Str("why", ops.why()).Msg("shutting down: no new jobs; running jobs may finish")
	sctx, cancel := context.WithTimeout(context.Background(), o.grace+stopMargin)
	defer cancel()
	if err := p.w.Stop(sctx); err != nil {
		log.Error().Err(err).Msg("stopping")
	}
	_ = hs.Stop(sctx)
	if err := p.jl.Stop(sctx); err != nil {
		log.Warn().Err(err).Msg("journal: not everything was persisted; it will be on the next start")
	}
	log.Info().Msg("worker stopped")
	return 0
}

// logStarted says the worker started, and how long it needs to stop.
func logStarted(o *options, p *parts, log zerolog.Logger) {
	grace := o.grace
	log.Info().Str("worker", p.w.ID()).Strs("agent", o.command[:1]).Int("slots", o.slots).Msg("worker started")
	log.Info().Dur("shutdown_grace", grace).Dur("needs", grace+stopMargin).
		Msgf("on SIGTERM running jobs get %s to finish, then are handed back: allow this worker %s before SIGKILL (e.g. terminationGracePeriodSeconds: %d)",
			grace, grace+stopMargin, int((grace + stopMargin).Seconds()))
}
