package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/shlex"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/httpserve"
	"github.com/agentfleet/agentfleet/internal/jsretry"
	"github.com/agentfleet/agentfleet/internal/pprofserve"
	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

func run(ctx context.Context, stop context.CancelFunc, args []string) int {
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	var (
		common                       config.Common
		storageURL, agentCmd, sbName string
		journalDir, httpAddr, sbDir  string
		cfURL, cfToken               string
		slots                        int
		grace, resultGrace           time.Duration
		agentEnv, jobEnvAllow        []string
		otherSandboxes               []string
		pprofAddr                    string
		gitCreds                     string
		wsAllowFile                  bool
		wsMaxBytes, sessionFilesMax  int64
		exitIfIdle                   time.Duration
		spillAfter                   time.Duration
	)
	config.AddCommon(fs, &common, "worker")
	fs.StringVar(&storageURL, "storage", "file://./data", "transcript storage URL (env FLEET_STORAGE)")
	fs.StringVar(&agentCmd, "agent-cmd", "claude", "agent program and fixed leading args, split like a shell (never run by one) (env FLEET_AGENT_CMD)")
	fs.StringVar(&sbName, "sandbox", "local", "default sandbox provider: local or cloudflare (env FLEET_SANDBOX)")
	fs.StringSliceVar(&otherSandboxes, "other-sandboxes", nil, "providers this worker lacks that other workers of the fleet have: their jobs are handed back, not failed (env FLEET_OTHER_SANDBOXES)")
	fs.IntVar(&slots, "slots", 4, "jobs run at once on this worker (env FLEET_SLOTS)")
	fs.Int64Var(&sessionFilesMax, "session-files-max", session.DefaultMaxFilesBytes, "most bytes of a session's files (transcript, subagents) in one checkpoint (env FLEET_SESSION_FILES_MAX)")
	fs.StringVar(&journalDir, "journal-dir", "./data/journal", "local journal directory (env FLEET_JOURNAL_DIR)")
	fs.DurationVar(&spillAfter, "journal-spill-after", worker.DefaultJournalSpillAfter, "the journal writes a line to disk only if the stream has not acknowledged it this long after the agent wrote it; 0 = every line to disk at once (env FLEET_JOURNAL_SPILL_AFTER)")
	fs.StringVar(&sbDir, "sandbox-dir", "./data/sandboxes", "where local sandboxes get their directories (env FLEET_SANDBOX_DIR)")
	fs.StringVar(&httpAddr, "http", "127.0.0.1:0", "address for /healthz, /readyz, /metrics; 127.0.0.1:0 = off (env FLEET_HTTP)")
	fs.DurationVar(&grace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long running jobs may finish before they are handed back (env FLEET_SHUTDOWN_GRACE)")
	fs.DurationVar(&resultGrace, "result-grace", 10*time.Second, "how long the agent may take to exit after its result (env FLEET_RESULT_GRACE)")
	fs.StringSliceVar(&agentEnv, "agent-env", []string{"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"},
		"variables copied from the worker's environment into the agent's (env FLEET_AGENT_ENV)")
	fs.StringSliceVar(&jobEnvAllow, "job-env-allow", nil, "variables a job's options.env may set (env FLEET_JOB_ENV_ALLOW)")
	fs.StringVar(&cfURL, "cf-bridge-url", "", "Cloudflare bridge Worker URL (env FLEET_CF_BRIDGE_URL)")
	pprofserve.AddFlag(fs, &pprofAddr)
	fs.StringVar(&cfToken, "cf-bridge-token", "", "Cloudflare bridge Worker token (env FLEET_CF_BRIDGE_TOKEN)")
	fs.StringVar(&gitCreds, "git-credentials", "", "git credentials for workspace fetch and push, in git's credential-store format; never shown to agents (env FLEET_GIT_CREDENTIALS)")
	fs.BoolVar(&wsAllowFile, "workspace-allow-file", false, "allow file:// workspace repositories: tests and single-machine use (env FLEET_WORKSPACE_ALLOW_FILE)")
	fs.Int64Var(&wsMaxBytes, "workspace-max-bytes", 2<<30, "fail a workspace checkout whose fetched repository is larger; 0 = no limit (env FLEET_WORKSPACE_MAX_BYTES)")
	fs.DurationVar(&exitIfIdle, "exit-if-idle", 0, "exit (drain, status 0) once no job has run for this long, for scale to zero; 0 = never (env FLEET_EXIT_IF_IDLE)")
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "worker takes no arguments, only flags: %q\n", strings.Join(fs.Args(), " "))
		return 2
	}
	log, err := config.Logger(common, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	config.ExitOnSecondSignal(ctx, stop, log)
	command, err := shlex.Split(agentCmd)
	if err != nil || len(command) == 0 {
		log.Error().Err(err).Msg("--agent-cmd must name a program")
		return 2
	}
	if sessionFilesMax < 1 {
		fmt.Fprintf(os.Stderr, "worker: --session-files-max must be at least 1 byte, not %d\n", sessionFilesMax)
		return 2
	}
	if err := checkFlags(slots, sbName, cfURL, command); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		return 2
	}
	if strings.Contains(command[0], "/") && !filepath.IsAbs(command[0]) {
		// A relative path means relative to the worker, not to the
		// sandbox's working directory.
		if abs, err := filepath.Abs(command[0]); err == nil {
			command[0] = abs
		}
	}

	log.Info().Str("nats_url", config.RedactURLs(common.NATSURL)).Msg("connecting to NATS")
	nc, js, err := config.ConnectJetStream(common, "fleet-worker", log)
	if err != nil {
		log.Error().Err(err).Msg("starting")
		return 1
	}
	defer func() { _ = nc.Drain() }()
	lost := config.StopOnClosedConnection(nc, log, stop)
	names := protocol.NewNames(common.Prefix)
	// Retried as the dispatcher's provisioning is (bounded): a young
	// cluster may not be able to place a nats:// bucket yet. A bucket the
	// worker makes has one replica (or ?replicas=); the dispatcher raises
	// it to its --replicas.
	var objects storage.Store
	octx, ocancel := context.WithTimeout(ctx, 2*time.Minute)
	err = jsretry.Do(octx, func(ctx context.Context) (err error) {
		objects, err = backends.Open(ctx, storageURL, backends.Objects, backends.Deps{
			JS: js, StatusBucket: names.StatusBucket(), ObjectBucket: names.ObjectBucket(), Logger: &log,
		})
		return err
	})
	ocancel()
	if err != nil {
		log.Error().Err(err).Msg("opening --storage")
		return 1
	}
	defer objects.Close()

	merge := transcript.NewReader(nc, names, objects).MergeIfArchived
	// The relay and the journal must agree on which lines go out as
	// pointers and are stored whole.
	lineLimit := worker.NewLineLimit(nc, names.QueriesStream())
	jl, err := journal.New(journal.Config{
		Dir: journalDir, Store: objects, Logger: &log,
		// The server's max payload is known only once connected; the
		// worker may start before its server does.
		LargeLineBytesFunc: lineLimit,
		// Memory first: lines go to disk only when the stream has not
		// acknowledged them in time; the archiver writes transcripts
		// from the stream, and chunks the journal stores (lines that
		// never reached the stream) are merged into them.
		SpillAfter:   spillAfter,
		AssembleFunc: merge, NonFinalFunc: merge,
	})
	if err != nil {
		log.Error().Err(err).Msg("journal")
		return 1
	}
	if err := jl.Start(ctx); err != nil {
		log.Error().Err(err).Msg("journal recovery")
		return 1
	}

	providers := map[string]sandbox.Provider{}
	absDir, _ := filepath.Abs(sbDir)
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: absDir, EnvAllow: agentEnv, Logger: &log})
	if err != nil {
		log.Error().Err(err).Msg("local sandbox")
		return 1
	}
	providers[protocol.SandboxLocal] = local
	if cfURL != "" {
		cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: cfURL, Token: cfToken, Logger: &log})
		if err != nil {
			log.Error().Err(err).Msg("cloudflare sandbox")
			return 1
		}
		providers[protocol.SandboxCloudflare] = cf
	}
	var creds workspace.Credentials
	if gitCreds != "" {
		if creds, err = workspace.LoadCredentials(gitCreds); err != nil {
			log.Error().Err(err).Msg("--git-credentials")
			return 2
		}
	}
	workspaces, err := workspace.New(workspace.Config{
		Store: objects, Credentials: creds, AllowFile: wsAllowFile, MaxBytes: wsMaxBytes, Logger: &log,
	})
	if err != nil {
		log.Error().Err(err).Msg("workspaces")
		return 2
	}
	runner, err := agent.New(agent.Config{Command: command, ResultGrace: resultGrace, Logger: &log})
	if err != nil {
		log.Error().Err(err).Msg("agent runner")
		return 2
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w, err := worker.New(worker.Config{
		NC: nc, Names: names, Slots: slots, Providers: providers, DefaultSandbox: sbName, OtherSandboxes: otherSandboxes,
		Runner: runner, Journal: jl, LineLimit: lineLimit, Workspaces: workspaces, EnvAllow: jobEnvAllow, ShutdownGrace: grace, Logger: &log,
		Metrics:     worker.NewMetrics(reg, slots, jl.Backlog),
		Sessions:    session.Config{Command: command, Logger: &log, MaxFilesBytes: sessionFilesMax},
		Checkpoints: objects,
	})
	if err != nil {
		log.Error().Err(err).Msg("worker")
		return 2
	}
	hs, err := httpserve.StartWithReason(httpAddr, w.NotReady, reg, log)
	if err != nil {
		log.Error().Err(err).Msg("--http")
		return 1
	}
	ps, err := pprofserve.Start(pprofAddr, log)
	if err != nil {
		log.Error().Err(err).Msg("--pprof")
		return 1
	}
	defer func() { _ = ps.Stop(context.Background()) }()
	if err := w.Start(ctx); err != nil {
		log.Error().Err(err).Msg("starting")
		return 1
	}
	log.Info().Str("worker", w.ID()).Strs("agent", command[:1]).Int("slots", slots).Msg("worker started")
	log.Info().Dur("shutdown_grace", grace).Dur("needs", grace+stopMargin).
		Msgf("on SIGTERM running jobs get %s to finish, then are handed back: allow this worker %s before SIGKILL (e.g. terminationGracePeriodSeconds: %d)",
			grace, grace+stopMargin, int((grace + stopMargin).Seconds()))
	ops, err := startOps(ctx, nc, names, w, exitIfIdle, log)
	if err != nil {
		log.Error().Err(err).Msg("discovery")
		return 1
	}
	defer ops.stop()
	<-ops.done()
	log.Info().Dur("grace", grace).Str("why", ops.why()).Msg("shutting down: no new jobs; running jobs may finish")
	sctx, cancel := context.WithTimeout(context.Background(), grace+stopMargin)
	defer cancel()
	if err := w.Stop(sctx); err != nil {
		log.Error().Err(err).Msg("stopping")
	}
	_ = hs.Stop(sctx)
	if err := jl.Stop(sctx); err != nil {
		log.Warn().Err(err).Msg("journal: not everything was persisted; it will be on the next start")
	}
	log.Info().Msg("worker stopped")
	if lost() != nil {
		return 1
	}
	return 0
}
