package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/admission"
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
)

func serve(ctx context.Context, stop context.CancelFunc, args []string, stdio fleetcli.IO) int {
	fs := pflag.NewFlagSet("dispatcher serve", pflag.ContinueOnError)
	var (
		common                    config.Common
		storageURL, statusURL     string
		httpAddr, pprofAddr       string
		maxConc, maxDeliver, reps int
		workerSlots               int
		uiToken                   string
		ackWait, maxAge, ttl      time.Duration
		tenantDefaults            admission.Settings
		leaseTTL, rlPause         time.Duration
		hookFlags                 webhook.Flags
	)
	config.AddCommon(fs, &common, "dispatcher")
	fs.StringVar(&storageURL, "storage", "file://./data", "transcript storage URL (env FLEET_STORAGE)")
	fs.StringVar(&statusURL, "status-storage", "", "status storage URL; defaults to --storage (env FLEET_STATUS_STORAGE)")
	fs.StringVar(&httpAddr, "http", "127.0.0.1:0", "address for /healthz, /readyz, /metrics and the dashboard at /; 127.0.0.1:0 = off (env FLEET_HTTP)")
	fs.StringVar(&uiToken, "ui-token", "", "token the dashboard requires (Authorization: Bearer, or /login); unset: loopback clients only (env FLEET_UI_TOKEN)")
	fs.IntVar(&maxConc, "max-concurrency", 64, "fleet-wide concurrency: the work consumer's MaxAckPending (env FLEET_MAX_CONCURRENCY)")
	fs.DurationVar(&ackWait, "ack-wait", 30*time.Second, "work consumer ack deadline; workers heartbeat within it (env FLEET_ACK_WAIT)")
	fs.IntVar(&maxDeliver, "max-deliver", 5, "attempts before a job is dead-lettered (env FLEET_MAX_DELIVER)")
	fs.DurationVar(&maxAge, "queries-max-age", 7*24*time.Hour, "how long per-query messages are kept for replay (env FLEET_QUERIES_MAX_AGE)")
	fs.DurationVar(&ttl, "session-ttl", 7*24*time.Hour, "a session parked for longer ends as succeeded (env FLEET_SESSION_TTL)")
	pprofserve.AddFlag(fs, &pprofAddr)
	fs.IntVar(&reps, "replicas", 1, "replicas of the streams and of nats:// storage buckets (3 on a cluster) (env FLEET_REPLICAS)")
	fs.IntVar(&workerSlots, "worker-slots", 4, "slots of one worker, for the fleet_desired_workers metric (env FLEET_WORKER_SLOTS)")
	fs.IntVar(&tenantDefaults.MaxRunning, "tenant-max-running", 0, "runs at once of a tenant without settings; 0 = only the fleet's cap (env FLEET_TENANT_MAX_RUNNING)")
	fs.Float64Var(&tenantDefaults.Weight, "tenant-weight", 1, "fair-share weight of a tenant without settings (env FLEET_TENANT_WEIGHT)")
	fs.DurationVar(&leaseTTL, "admitter-lease", 5*time.Second, "the admitter's leadership lease; a standby dispatcher takes over about this long after the admitting one dies (env FLEET_ADMITTER_LEASE)")
	fs.DurationVar(&rlPause, "rate-limit-pause", time.Minute, "how long a tenant pauses after an API 429 with no reset time (env FLEET_RATE_LIMIT_PAUSE)")
	webhook.AddFlags(fs, &hookFlags)
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stdio.Err, err)
		return fleetcli.ExitUsage
	}
	if err := errors.Join(checkServeFlags(maxConc, maxDeliver, reps, ackWait, maxAge, ttl, leaseTTL, rlPause), hookFlags.Check()); err != nil {
		fmt.Fprintln(stdio.Err, "dispatcher serve:", err)
		return fleetcli.ExitUsage
	}
	log, err := config.Logger(common, stdio.Err)
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return fleetcli.ExitUsage
	}
	config.ExitOnSecondSignal(ctx, stop, log)
	nc, js, err := config.ConnectJetStream(common, "fleet-dispatcher", log)
	if err != nil {
		log.Error().Err(err).Msg("starting")
		return 1
	}
	defer func() { _ = nc.Drain() }()
	lost := config.StopOnClosedConnection(nc, log, stop)
	exit := func() int {
		if lost() != nil {
			return 1
		}
		return 0
	}
	names := protocol.NewNames(common.Prefix)
	// nats:// buckets follow --replicas, so on a cluster they survive a
	// node as the streams do. Opening is retried as provisioning is: a
	// young cluster may not be able to place a replicated bucket yet. The
	// retries are bounded, so a store that stays away fails the start.
	deps := backends.Deps{JS: js, StatusBucket: names.StatusBucket(), ObjectBucket: names.ObjectBucket(), Replicas: reps, Logger: &log}
	var objects, status storage.Store
	octx, ocancel := context.WithTimeout(ctx, 2*time.Minute)
	err = provision.Retry(octx, func(ctx context.Context) (err error) {
		objects, status, err = backends.OpenBoth(ctx, storageURL, statusURL, deps)
		return err
	})
	ocancel()
	if err != nil {
		log.Error().Err(err).Msg("opening --storage / --status-storage")
		return 1
	}
	defer objects.Close()
	defer status.Close()
	svc, err := dispatcher.New(dispatcher.Config{
		NC: nc, Status: status, Objects: objects, Logger: &log, SessionTTL: ttl,
		Provision: provision.Config{Names: names, MaxConcurrency: maxConc, AckWait: ackWait, MaxDeliver: maxDeliver, QueriesMaxAge: maxAge, Replicas: reps},
		Admission: admission.Config{Policy: admission.Policy{Defaults: tenantDefaults}, LeaseTTL: leaseTTL, RateLimitPause: rlPause},
	})
	if err != nil {
		log.Error().Err(err).Msg("dispatcher")
		return 1
	}
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = svc.Start(sctx)
		cancel()
		if err == nil {
			break
		}
		log.Warn().Err(err).Msg("starting the dispatcher; retrying")
		select {
		case <-ctx.Done():
			return exit()
		case <-time.After(2 * time.Second):
		}
	}
	// The archiver completes finished queries' transcripts from the stream
	// (a lost worker's unflushed tail, lines a full journal could not take).
	arch, err := archiver.New(archiver.Config{NC: nc, Names: names, Store: objects, Logger: &log})
	if err != nil {
		log.Error().Err(err).Msg("archiver")
		return 1
	}
	if err := arch.Start(ctx); err != nil {
		log.Error().Err(err).Msg("starting the archiver")
		return 1
	}
	hooks, err := startWebhooks(ctx, nc, names, hookFlags, reps, &log)
	if err != nil {
		log.Error().Err(err).Msg("starting webhooks")
		return 1
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	queue, err := queueMetrics(nc, names, workerSlots)
	if err != nil {
		log.Error().Err(err).Msg("--worker-slots")
		return fleetcli.ExitUsage
	}
	reg.MustRegister(queue)
	ui, err := dashboard.New(dashboard.Config{Client: queue.Client(), Queue: queue, Token: uiToken, Objects: objects, Logger: &log})
	if err != nil {
		log.Error().Err(err).Msg("dashboard")
		return 1
	}
	handler, err := withAPI(queue.Client(), status, objects, uiToken, nil, ui, &log)
	if err != nil {
		log.Error().Err(err).Msg("http api")
		return 1
	}
	hs, err := httpserve.StartWithUI(httpAddr, func() error {
		if svc.Ready() {
			return nil
		}
		return errors.New("not ready")
	}, reg, handler, log)
	if err != nil {
		log.Error().Err(err).Msg("--http")
		return 1
	}
	ps, err := pprofserve.Start(pprofAddr, log)
	if err != nil {
		log.Error().Err(err).Msg("--pprof")
		return 1
	}
	<-ctx.Done()
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = hs.Stop(sctx)
	_ = ps.Stop(sctx)
	if err := hooks.Stop(sctx); err != nil {
		log.Warn().Err(err).Msg("stopping webhooks")
	}
	if err := arch.Stop(sctx); err != nil {
		log.Warn().Err(err).Msg("stopping the archiver")
	}
	if err := svc.Stop(sctx); err != nil {
		log.Warn().Err(err).Msg("stopping the dispatcher")
	}
	return exit()
}

// checkServeFlags rejects values that can never work, at once and with a
// usage error, instead of a start that retries them forever (they are not
// a transient failure) or a zero that silently becomes a default.
func checkServeFlags(maxConc, maxDeliver, reps int, ackWait, maxAge, ttl, leaseTTL, rlPause time.Duration) error {
	switch {
	case maxConc < 1:
		return fmt.Errorf("--max-concurrency %d: must be at least 1", maxConc)
	case maxDeliver < 1:
		return fmt.Errorf("--max-deliver %d: must be at least 1", maxDeliver)
	case reps < 1 || reps > 5:
		return fmt.Errorf("--replicas %d: must be between 1 and 5", reps)
	case ackWait < time.Second:
		return fmt.Errorf("--ack-wait %s: must be at least 1s", ackWait)
	case maxAge < time.Minute:
		return fmt.Errorf("--queries-max-age %s: must be at least 1m (queries are replayed from it)", maxAge)
	case ttl <= 0:
		return fmt.Errorf("--session-ttl %s: must be positive", ttl)
	case leaseTTL < time.Second:
		return fmt.Errorf("--admitter-lease %s: must be at least 1s", leaseTTL)
	case rlPause <= 0:
		return fmt.Errorf("--rate-limit-pause %s: must be positive", rlPause)
	}
	return nil
}
