package worker

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/tracing"
	"github.com/agentfleet/agentfleet/pkg/warm"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// DefaultJournalSpillAfter is the worker's journal.Config.SpillAfter: a
// line the stream has not acknowledged this long after the agent wrote it
// goes to the local disk (NATS away or slow); on the happy path nothing is
// written.
const DefaultJournalSpillAfter = time.Second

// Config configures a Worker.
type Config struct {
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// Names builds subjects and stream names. Defaults to the default prefix.
	Names protocol.Names
	// ID names this worker in status events. Defaults to <hostname>-<random>.
	ID string
	// Slots is how many jobs run at once on this worker. Defaults to 4.
	Slots int
	// Providers are the sandbox providers by name ("local", "cloudflare").
	// At least one is required.
	Providers map[string]sandbox.Provider
	// DefaultSandbox is the provider for jobs that name none. Defaults to "local".
	DefaultSandbox string
	// OtherSandboxes names providers that this worker lacks but other
	// workers of the fleet have: a job for one of them is handed back (Nak)
	// for them to take. A job for a provider neither here nor in this list
	// fails at once (spawn_failed, saying which provider is missing) instead
	// of being redelivered until max_deliveries. Defaults to none.
	OtherSandboxes []string
	// Runner runs the agent. Required.
	Runner *agent.Runner
	// Journal keeps every line before it is published. Required.
	Journal *journal.Journal
	// LineLimit is the line size above which a line is relayed as a
	// pointer and stored whole: pass the same NewLineLimit to the journal
	// (journal.Config.LargeLineBytesFunc), which must agree. Defaults to
	// NewLineLimit(NC, Names.QueriesStream()).
	LineLimit func() int
	// Workspaces checks out and captures the repositories of jobs with a
	// workspace (docs/workspaces.md). Nil fails such jobs with workspace_checkout.
	Workspaces *workspace.Workspaces
	// EnvCache keeps the results of jobs' setup scripts (docs/warm.md; setup.go);
	// nil runs every setup.
	EnvCache *envcache.Cache
	// Warm is how many agents to keep started ahead per option profile
	// (docs/warm.md; warm.go); 0 starts every agent cold.
	Warm int
	// EnvAllow lists the names a job's options.env may set. Defaults to none.
	// The model credential variables and ANTHROPIC_BASE_URL are never
	// allowed (ReservedModelEnv).
	EnvAllow []string
	// Gateway is the model gateway (docs/gateway.md): every run gets a token of it
	// and its URL as ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL, its calls
	// are metered and capped, and its terminal status reports the metered
	// spend. The worker does not start or stop it (its owner does, after
	// the worker has stopped). Nil: runs get no model credential at all.
	Gateway *gateway.Gateway
	// TenantBudget, if set with Gateway, gives the gateway a tenant's
	// live budget (gateway.RunInfo.TenantBudget) for each run it opens.
	// An error (the budget could not be read) refuses the run: it ends
	// failed / budget saying why, never unlimited.
	TenantBudget func(tenant string) (func() (remainingUSD float64, limited bool), error)
	// ShutdownGrace is how long running jobs may finish on Stop before they
	// are handed back. Defaults to 30s.
	ShutdownGrace time.Duration
	// Heartbeat is the InProgress interval. Defaults to the consumer's AckWait/3.
	Heartbeat time.Duration
	// PublishWindow is how many async publishes a run keeps in flight.
	// Defaults to 256.
	PublishWindow int
	// QueueBytes bounds the bytes of each run's lines not yet stored in
	// the stream (queued or in flight); beyond it the agent's pipe waits.
	// Defaults to half the journal's default SpillBytes (2 MiB), so an
	// agent that writes faster than the stream stores is slowed to the
	// stream's pace rather than spilling its journal to disk; keep it
	// below the journal's SpillBytes.
	QueueBytes int
	// PublishTimeout bounds each publish's wait for its PubAck (a line
	// whose acknowledgement does not come in time fails, and the relay
	// recovers), each ack and each read of the stream; failures are
	// retried. Defaults to 5s.
	PublishTimeout time.Duration
	// ClaimTimeout bounds the start of a run (reading the query's state,
	// claiming it): a worker that cannot reach the stream in that time hands
	// the job back rather than hold it. Defaults to 30s.
	ClaimTimeout time.Duration
	// FlushTimeout bounds the wait for every line of a finished run to be
	// stored; past it the job is handed back. Defaults to 5m.
	FlushTimeout time.Duration
	// PullExpiry is the lifetime of each pull request, and PullHeartbeat
	// the server's idle heartbeat on it: a pull lost with a consumer leader
	// is noticed after two missed heartbeats and issued again. Default 10s
	// and 2s.
	PullExpiry, PullHeartbeat time.Duration
	// ConsumerRetry is how often to look for the work consumer while it does
	// not exist yet. Defaults to 1s.
	ConsumerRetry time.Duration
	// CreateTimeout bounds sandbox creation (cold starts). Defaults to 5m.
	CreateTimeout time.Duration
	// Metrics; nil creates unregistered ones.
	Metrics *Metrics
	// Logger; nil is Nop.
	Logger *zerolog.Logger
	// Sessions configures session jobs (docs/sessions.md); its Command is the agent
	// program (the same as the runner's). Session jobs fail to start while
	// Command is empty.
	Sessions session.Config
	// Checkpoints stores session checkpoints (queries/<tenant>/<id>/session/);
	// nil disables sessions and options.resume restores.
	Checkpoints storage.Store
	// Network is what jobs' agents may reach (docs/contained.md; network.go).
	Network NetworkConfig
	// LimitsMax are the most a job may ask in its limits (--limit-*-max);
	// a job asking more fails with limits_not_allowed before any process
	// starts. Zero fields: no maximum. The local provider's LocalConfig
	// holds the same maximums and the defaults (--limit-*).
	LimitsMax sandbox.Limits
	// StallTimeout is how long the agent may write nothing while a turn
	// runs before the turn is stalled (stall.go); a job's
	// options.stall_timeout replaces it. 0: no stall watch for jobs that
	// set none.
	StallTimeout time.Duration
	// StallTimeoutMax is the most a job's options.stall_timeout may ask;
	// above it the job fails as invalid. 0: no maximum.
	StallTimeoutMax time.Duration
	// StallGrace is how long a stalled session turn may take to answer its
	// interrupt before its agent is stopped. Defaults to 30s.
	StallGrace time.Duration
	// Tracing makes the runs' spans (trace.go); nil: none.
	Tracing *tracing.Tracing
	// Test hooks.
	Test TestConfig
}

// TestConfig holds test-only hooks.
type TestConfig struct {
	// RunStarted, if set, is called when a run's agent is about to start.
	RunStarted func(tenant, id string, attempt int)
	// RunEnded, if set, is called when a run's agent has ended.
	RunEnded func(tenant, id string, attempt int)
	// SessionIdle, if set, replaces every session's idle timeout.
	SessionIdle time.Duration
	// StallChecked, if set, is called after each check of a run's stall
	// watch that found the turn silent for its timeout (stall.go): stalled
	// says whether it declared a stall (false: an approval or a busy tool
	// call kept it going).
	StallChecked func(tenant, id string, stalled bool)
	// WarmEvents, if set, is given the warm pool's events (warm.go).
	WarmEvents func(<-chan warm.Event)
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%06x", cmp.Or(host, "worker"), rand.IntN(1<<24))
	}
	c.Slots = cmp.Or(c.Slots, 4)
	c.DefaultSandbox = cmp.Or(c.DefaultSandbox, protocol.SandboxLocal)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 30*time.Second)
	c.PublishWindow = cmp.Or(c.PublishWindow, 256)
	if c.LineLimit == nil && c.NC != nil {
		c.LineLimit = NewLineLimit(c.NC, c.Names.QueriesStream())
	}
	c.QueueBytes = cmp.Or(c.QueueBytes, journal.DefaultSpillBytes/2)
	c.ConsumerRetry = cmp.Or(c.ConsumerRetry, time.Second)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, 30*time.Second)
	c.FlushTimeout = cmp.Or(c.FlushTimeout, 5*time.Minute)
	c.PullExpiry = cmp.Or(c.PullExpiry, 10*time.Second)
	c.PullHeartbeat = cmp.Or(c.PullHeartbeat, 2*time.Second)
	c.CreateTimeout = cmp.Or(c.CreateTimeout, 5*time.Minute)
	c.StallGrace = cmp.Or(c.StallGrace, 30*time.Second)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.NC == nil:
		return errors.New("worker: NC is required")
	case c.Runner == nil:
		return errors.New("worker: Runner is required")
	case c.Journal == nil:
		return errors.New("worker: Journal is required")
	case len(c.Providers) == 0:
		return errors.New("worker: at least one sandbox provider is required")
	case c.Providers[c.DefaultSandbox] == nil:
		return fmt.Errorf("worker: DefaultSandbox %q has no provider", c.DefaultSandbox)
	case c.Slots < 1 || c.Slots > 1024:
		return errors.New("worker: Slots must be between 1 and 1024")
	case c.Warm < 0 || c.Warm > 64:
		return errors.New("worker: Warm must be between 0 and 64")
	case c.ShutdownGrace < 0:
		return errors.New("worker: ShutdownGrace must not be negative")
	case reservedIn(c.EnvAllow) != "":
		return fmt.Errorf("worker: EnvAllow may not list %s: the model credential and ANTHROPIC_BASE_URL are the worker's, never a job's", reservedIn(c.EnvAllow))
	case c.StallTimeout < 0 || c.StallTimeoutMax < 0 || c.StallGrace < 0:
		return errors.New("worker: StallTimeout, StallTimeoutMax and StallGrace must not be negative")
	case c.StallTimeoutMax > 0 && c.StallTimeout > c.StallTimeoutMax:
		return errors.New("worker: StallTimeout must not exceed StallTimeoutMax")
	case c.PullHeartbeat*2 > c.PullExpiry:
		return errors.New("worker: PullHeartbeat must be at most half of PullExpiry")
	}
	return nil
}
