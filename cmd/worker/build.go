package main

import (
	"context"
	"net/url"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/internal/jsretry"
	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// buildError is a failure to build the worker: what failed, and the exit
// code it means (1: a service or storage; 2: a setting).
type buildError struct {
	code int
	what string
	err  error
}

func (e *buildError) Error() string { return e.what + ": " + e.err.Error() }
func (e *buildError) Unwrap() error { return e.err }

func failed(code int, what string, err error) error {
	return &buildError{code: code, what: what, err: err}
}

// parts are what a running worker command is made of.
type parts struct {
	nc      *nats.Conn
	names   protocol.Names
	objects storage.Store
	jl      *journal.Journal
	reg     *prometheus.Registry
	w       *worker.Worker
	// gw is the model gateway (nil: none); stopped after the worker.
	gw *gateway.Gateway
	// repos and envs are --repo-cache's (nil: none); repos is stopped
	// after the worker.
	repos *repocache.Cache
	envs  *envcache.Cache
}

// build makes the worker and what it needs, on a connection to NATS.
// On an error what it opened is closed again.
func build(ctx context.Context, o *options, nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger) (p *parts, err error) {
	p = &parts{nc: nc, names: protocol.NewNames(o.common.Prefix)}
	if p.objects, err = openStorage(ctx, o.storageURL, js, p.names, log); err != nil {
		return nil, failed(1, "opening --storage", err)
	}
	defer func() {
		if err != nil {
			_ = p.objects.Close()
		}
	}()
	// The relay and the journal must agree on which lines go out as
	// pointers and are stored whole.
	lineLimit := worker.NewLineLimit(nc, p.names.QueriesStream())
	if p.jl, err = openJournal(ctx, o, nc, p.names, p.objects, lineLimit, log); err != nil {
		return nil, err
	}
	providers, err := newProviders(o, log)
	if err != nil {
		return nil, err
	}
	if p.repos, p.envs, err = openCaches(ctx, o, log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			stopRepoCache(p.repos, log)
		}
	}()
	workspaces, err := newWorkspaces(o, p.objects, p.repos, log)
	if err != nil {
		return nil, err
	}
	runner, err := agent.New(agent.Config{Command: o.command, ResultGrace: o.resultGrace, Logger: &log})
	if err != nil {
		return nil, failed(2, "agent runner", err)
	}
	if p.gw, err = startGateway(o, nc, js, p.names, log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			stopGateway(p.gw, log)
		}
	}()
	p.reg = prometheus.NewRegistry()
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p.w, err = worker.New(worker.Config{
		NC: nc, Names: p.names, Slots: o.slots, Providers: providers, DefaultSandbox: o.sbName, OtherSandboxes: o.otherSandboxes,
		Runner: runner, Journal: p.jl, LineLimit: lineLimit, Workspaces: workspaces, EnvAllow: o.jobEnvAllow, ShutdownGrace: o.grace, Logger: &log,
		Metrics:     worker.NewMetrics(p.reg, o.slots, p.jl.Backlog),
		Sessions:    session.Config{Command: o.command, Logger: &log, MaxFilesBytes: o.sessionFilesMax},
		Checkpoints: p.objects, Gateway: p.gw, TenantBudget: worker.TenantBudgets(js, p.names, log),
		EnvCache: p.envs, Warm: o.warm,
		Tracing: o.tracing, StallTimeout: o.stallTimeout, StallTimeoutMax: o.stallMax, StallGrace: o.stallGrace,
		Network: o.contain.networkConfig(o.agentEnv, p.gw, log), LimitsMax: o.contain.limitsMax,
	})
	if err != nil {
		return nil, failed(2, "worker", err)
	}
	return p, nil
}

// openStorage opens --storage, retried as the dispatcher's provisioning
// is (bounded): a young cluster may not be able to place a nats:// bucket
// yet. A bucket the worker makes has one replica (or ?replicas=); the
// dispatcher raises it to its --replicas.
func openStorage(ctx context.Context, url string, js jetstream.JetStream, names protocol.Names, log zerolog.Logger) (objects storage.Store, err error) {
	octx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = jsretry.Do(octx, func(ctx context.Context) (err error) {
		objects, err = backends.Open(ctx, url, backends.Objects, backends.Deps{
			JS: js, StatusBucket: names.StatusBucket(), ObjectBucket: names.ObjectBucket(), Logger: &log,
		})
		return err
	})
	return objects, err
}

// openJournal opens and recovers the journal.
func openJournal(ctx context.Context, o *options, nc *nats.Conn, names protocol.Names, objects storage.Store, lineLimit func() int, log zerolog.Logger) (*journal.Journal, error) {
	merge := transcript.NewReader(nc, names, objects).MergeIfArchived
	jl, err := journal.New(journal.Config{
		Dir: o.journalDir, Store: objects, Logger: &log,
		// The server's max payload is known only once connected; the
		// worker may start before its server does.
		LargeLineBytesFunc: lineLimit,
		// Memory first: lines go to disk only when the stream has not
		// acknowledged them in time; the archiver writes transcripts
		// from the stream, and chunks the journal stores (lines that
		// never reached the stream) are merged into them.
		SpillAfter:   o.spillAfter,
		AssembleFunc: merge, NonFinalFunc: merge,
	})
	if err != nil {
		return nil, failed(1, "journal", err)
	}
	if err := jl.Start(ctx); err != nil {
		return nil, failed(1, "journal recovery", err)
	}
	return jl, nil
}

// newProviders makes the sandbox providers: local unless it cannot be
// contained on a Cloudflare worker (containOptions.check), cloudflare
// with --cf-bridge-url.
func newProviders(o *options, log zerolog.Logger) (map[string]sandbox.Provider, error) {
	providers := map[string]sandbox.Provider{}
	if !o.contain.noLocal {
		absDir, _ := filepath.Abs(o.sbDir)
		local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: absDir, EnvAllow: o.agentEnv, Logger: &log,
			Isolation: o.contain.isolation, AgentUID: o.contain.agentUID, HiddenPaths: o.workerPaths(),
			DefaultLimits: o.contain.limitsDefault, MaxLimits: o.contain.limitsMax})
		if err != nil {
			return nil, failed(1, "local sandbox", err)
		}
		providers[protocol.SandboxLocal] = local
	}
	if o.cfURL != "" {
		cf, err := sandbox.NewCloudflare(sandbox.CloudflareConfig{BaseURL: o.cfURL, Token: o.cfToken, Logger: &log,
			WorkerVersion: buildinfo.Version()})
		if err != nil {
			return nil, failed(1, "cloudflare sandbox", err)
		}
		providers[protocol.SandboxCloudflare] = cf
	}
	return providers, nil
}

// newWorkspaces makes the workspaces' checkout and capture, with
// --git-credentials.
func newWorkspaces(o *options, objects storage.Store, repos *repocache.Cache, log zerolog.Logger) (*workspace.Workspaces, error) {
	var creds workspace.Credentials
	if o.gitCreds != "" {
		var err error
		if creds, err = workspace.LoadCredentials(o.gitCreds); err != nil {
			return nil, failed(2, "--git-credentials", err)
		}
	}
	ws, err := workspace.New(workspace.Config{
		Store: objects, Credentials: creds, AllowFile: o.wsAllowFile, MaxBytes: o.wsMaxBytes, Logger: &log, Cache: repos,
	})
	if err != nil {
		return nil, failed(2, "workspaces", err)
	}
	return ws, nil
}

// workerPaths are the worker's own files, which a contained agent must
// never see, not even beside its program: NATS credentials, file://
// storage, journal, repository cache, git credentials.
func (o *options) workerPaths() []string {
	var out []string
	var store string
	if u, err := url.Parse(o.storageURL); err == nil && u.Scheme == "file" {
		store, _ = backends.FilePath(u)
	}
	for _, p := range []string{o.common.NATSCreds, store, o.journalDir, o.repoCache, o.gitCreds} {
		if p == "" {
			continue
		}
		if abs, err := filepath.Abs(p); err == nil {
			out = append(out, abs)
		}
	}
	return out
}
