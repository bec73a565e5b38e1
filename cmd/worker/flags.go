package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/shlex"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/pprofserve"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// options are the worker command's flags (or their FLEET_* variables).
type options struct {
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
	modelUpstream                string
	modelPricesFile              string
	modelPrices                  gateway.Prices
	repoCache                    string
	envSpares                    int
	repoCacheTrees               int
	warm                         int
	contain                      containOptions
	stallTimeout, stallMax       time.Duration
	stallGrace                   time.Duration
	tracing                      *tracing.Tracing // from OTEL_* (run)

	// command is --agent-cmd split like a shell, its program made
	// absolute when given as a relative path (validate).
	command []string
}

// flags is the worker command's flag table.
func flags(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	config.AddCommon(fs, &o.common, "worker")
	fs.StringVar(&o.storageURL, "storage", "file://./data", "transcript storage URL (env FLEET_STORAGE)")
	fs.StringVar(&o.agentCmd, "agent-cmd", "claude", "agent program and fixed leading args, split like a shell (never run by one) (env FLEET_AGENT_CMD)")
	fs.StringVar(&o.sbName, "sandbox", "local", "default sandbox provider: local or cloudflare (env FLEET_SANDBOX)")
	fs.StringSliceVar(&o.otherSandboxes, "other-sandboxes", nil, "providers this worker lacks that other workers of the fleet have: their jobs are handed back, not failed (env FLEET_OTHER_SANDBOXES)")
	fs.IntVar(&o.slots, "slots", 4, "jobs run at once on this worker (env FLEET_SLOTS)")
	fs.Int64Var(&o.sessionFilesMax, "session-files-max", session.DefaultMaxFilesBytes, "most bytes of a session's files (transcript, subagents) in one checkpoint (env FLEET_SESSION_FILES_MAX)")
	fs.StringVar(&o.journalDir, "journal-dir", "./data/journal", "local journal directory (env FLEET_JOURNAL_DIR)")
	fs.DurationVar(&o.spillAfter, "journal-spill-after", worker.DefaultJournalSpillAfter, "the journal writes a line to disk only if the stream has not acknowledged it this long after the agent wrote it; 0 = every line to disk at once (env FLEET_JOURNAL_SPILL_AFTER)")
	fs.StringVar(&o.sbDir, "sandbox-dir", "./data/sandboxes", "where local sandboxes get their directories (env FLEET_SANDBOX_DIR)")
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:0", "address for /healthz, /readyz, /metrics; 127.0.0.1:0 = off (env FLEET_HTTP)")
	fs.DurationVar(&o.grace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long running jobs may finish before they are handed back (env FLEET_SHUTDOWN_GRACE)")
	fs.DurationVar(&o.resultGrace, "result-grace", 10*time.Second, "how long the agent may take to exit after its result (env FLEET_RESULT_GRACE)")
	fs.StringSliceVar(&o.agentEnv, "agent-env", nil,
		"variables copied from the worker's environment into the agent's; never the model credential or ANTHROPIC_BASE_URL (env FLEET_AGENT_ENV)")
	fs.StringVar(&o.modelUpstream, "model-upstream", gateway.DefaultUpstream,
		"the API the model gateway forwards the agents' calls to, with the worker's ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN; off = no gateway, agents get no model credential (env FLEET_MODEL_UPSTREAM)")
	fs.StringVar(&o.modelPricesFile, "model-prices", "", "a JSON file of model prices that override or add to the built-in ones (env FLEET_MODEL_PRICES)")
	fs.StringSliceVar(&o.jobEnvAllow, "job-env-allow", nil, "variables a job's options.env may set (env FLEET_JOB_ENV_ALLOW)")
	fs.StringVar(&o.cfURL, "cf-bridge-url", "", "Cloudflare bridge Worker URL (env FLEET_CF_BRIDGE_URL)")
	pprofserve.AddFlag(fs, &o.pprofAddr)
	fs.StringVar(&o.cfToken, "cf-bridge-token", "", "Cloudflare bridge Worker token (env FLEET_CF_BRIDGE_TOKEN)")
	fs.StringVar(&o.gitCreds, "git-credentials", "", "git credentials for workspace fetch and push, in git's credential-store format; never shown to agents (env FLEET_GIT_CREDENTIALS)")
	fs.BoolVar(&o.wsAllowFile, "workspace-allow-file", false, "allow file:// workspace repositories: tests and single-machine use (env FLEET_WORKSPACE_ALLOW_FILE)")
	fs.Int64Var(&o.wsMaxBytes, "workspace-max-bytes", 2<<30, "fail a workspace checkout whose fetched repository is larger; 0 = no limit (env FLEET_WORKSPACE_MAX_BYTES)")
	addContainFlags(fs, &o.contain)
	fs.DurationVar(&o.exitIfIdle, "exit-if-idle", 0, "exit (drain, status 0) once no job has run for this long, for scale to zero; 0 = never (env FLEET_EXIT_IF_IDLE)")
	fs.StringVar(&o.repoCache, "repo-cache", "", "directory of the repository cache and the setup environments (docs/warm.md); empty = none (env FLEET_REPO_CACHE)")
	fs.IntVar(&o.envSpares, "env-cache-spares", envcache.DefaultSpares, "copies of each setup environment in --repo-cache kept prepared in the background, so a restore moves one into the checkout instead of copying (docs/warm.md); 0 = none (env FLEET_ENV_CACHE_SPARES)")
	fs.IntVar(&o.repoCacheTrees, "repo-cache-trees", 1, "prepared working trees the repository cache keeps per repository, at the commit it served last, made in the background between jobs; 0 = none (env FLEET_REPO_CACHE_TREES)")
	fs.DurationVar(&o.stallTimeout, "stall-timeout", 10*time.Minute, "a turn whose agent writes no line this long is stalled: a one-shot run fails (code stalled), a session turn is interrupted; a job's options.stall_timeout replaces it; 0 = off (env FLEET_STALL_TIMEOUT)")
	fs.DurationVar(&o.stallMax, "stall-timeout-max", time.Hour, "the most a job's options.stall_timeout may ask; above it the job fails as invalid; 0 = no maximum (env FLEET_STALL_TIMEOUT_MAX)")
	fs.DurationVar(&o.stallGrace, "stall-grace", 30*time.Second, "how long a stalled session turn may take to answer its interrupt before its agent is stopped and the session resumed from its checkpoint (env FLEET_STALL_GRACE)")
	fs.IntVar(&o.warm, "warm", 0, "agents kept started ahead per option profile (docs/warm.md); 0 = off (env FLEET_WARM)")
	return fs
}

// parse parses args into options. ok false means run ends with code:
// 0 after --help, 2 on a bad flag (said on stderr).
func parse(args []string) (o *options, code int, ok bool) {
	o = &options{}
	fs := flags(o)
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, 0, false
		}
		fmt.Fprintln(os.Stderr, err)
		return nil, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "worker takes no arguments, only flags: %q\n", strings.Join(fs.Args(), " "))
		return nil, 2, false
	}
	return o, 0, true
}

// validate refuses, before anything connects, settings that would fail
// later or quietly mean something else, and sets command.
func (o *options) validate() error {
	command, err := shlex.Split(o.agentCmd)
	switch {
	case err != nil:
		return fmt.Errorf("--agent-cmd must name a program: %w", err)
	case len(command) == 0:
		return errors.New("--agent-cmd must name a program")
	}
	if o.envSpares < 0 || o.envSpares > 16 {
		return fmt.Errorf("--env-cache-spares must be between 0 and 16, not %d", o.envSpares)
	}
	if o.stallTimeout < 0 || o.stallMax < 0 || o.stallGrace <= 0 {
		return errors.New("--stall-timeout and --stall-timeout-max must not be negative, and --stall-grace must be above 0")
	}
	if o.stallMax > 0 && o.stallTimeout > o.stallMax {
		return fmt.Errorf("--stall-timeout %s is above --stall-timeout-max %s", o.stallTimeout, o.stallMax)
	}
	if o.warm < 0 || o.warm > 64 {
		return fmt.Errorf("--warm must be between 0 and 64, not %d", o.warm)
	}
	if err := checkCacheFlags(o); err != nil {
		return err
	}
	if o.sessionFilesMax < 1 {
		return fmt.Errorf("--session-files-max must be at least 1 byte, not %d", o.sessionFilesMax)
	}
	if err := checkFlags(o.slots, o.sbName, o.cfURL, command); err != nil {
		return err
	}
	if err := o.checkModelFlags(); err != nil {
		return err
	}
	if strings.Contains(command[0], "/") && !filepath.IsAbs(command[0]) {
		// A relative path means relative to the worker, not to the
		// sandbox's working directory.
		if abs, err := filepath.Abs(command[0]); err == nil {
			command[0] = abs
		}
	}
	o.command = command
	return nil
}
