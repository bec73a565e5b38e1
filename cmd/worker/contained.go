package main

// The worker's contained sandboxes (docs/contained.md): --isolation, --agent-uid,
// --network-default, --network-max.

import (
	"fmt"
	"net/url"
	"os"
	"slices"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// containOptions are the containment flags (docs/contained.md), and what
// they parse into.
type containOptions struct {
	isolation string
	// noLocal: this worker has no local provider (--sandbox cloudflare
	// with --isolation unset on a machine that cannot contain).
	noLocal            bool
	agentUID           int
	netDefault, netMax string
	egressAllow        string
	egressDeny         egress.Deny
	defaultNet         egress.Policy
	maxNet             egress.Mode
	// Limits of a contained run (docs/contained.md): defaults and maximums.
	memMB, memMaxMB          int64
	pids, pidsMax            int
	cpuWeight, cpuWeightMax  int
	limitsDefault, limitsMax sandbox.Limits
}

func addContainFlags(fs *pflag.FlagSet, c *containOptions) {
	fs.StringVar(&c.isolation, "isolation", "", "local sandboxes: contained (bubblewrap namespaces) or none (a plain child process, as the worker's user); unset = contained, and the worker refuses to start where it cannot contain (env FLEET_ISOLATION)")
	fs.IntVar(&c.agentUID, "agent-uid", sandbox.DefaultAgentUID, "uid of a contained agent; never 0 (env FLEET_AGENT_UID)")
	fs.StringVar(&c.netDefault, "network-default", "none", `network of a job that names none: none, open or {"allow":[…]} (env FLEET_NETWORK_DEFAULT)`)
	fs.StringVar(&c.netMax, "network-max", "allow", "the most network a job may ask for: none, allow or open (env FLEET_NETWORK_MAX)")
	fs.StringVar(&c.egressAllow, "egress-allow-private", "", "CIDR[,CIDR…] of loopback, private, link-local or metadata addresses a job's allow list may reach through the egress proxy; default none (env FLEET_EGRESS_ALLOW_PRIVATE)")
	fs.Int64Var(&c.memMB, "limit-memory-mb", 0, "a contained run's memory.max in MiB when its job's limits name none; 0 = none (env FLEET_LIMIT_MEMORY_MB)")
	fs.Int64Var(&c.memMaxMB, "limit-memory-mb-max", 0, "the most memory (MiB) a job's limits may ask; 0 = no maximum (env FLEET_LIMIT_MEMORY_MB_MAX)")
	fs.IntVar(&c.pids, "limit-pids", 0, "a contained run's pids.max when its job's limits name none; 0 = none (env FLEET_LIMIT_PIDS)")
	fs.IntVar(&c.pidsMax, "limit-pids-max", 0, "the most processes a job's limits may ask; 0 = no maximum (env FLEET_LIMIT_PIDS_MAX)")
	fs.IntVar(&c.cpuWeight, "limit-cpu-weight", 0, "a contained run's cpu.weight (1-10000) when its job's limits name none; 0 = the kernel's (env FLEET_LIMIT_CPU_WEIGHT)")
	fs.IntVar(&c.cpuWeightMax, "limit-cpu-weight-max", 0, "the highest cpu.weight a job's limits may ask; 0 = no maximum (env FLEET_LIMIT_CPU_WEIGHT_MAX)")
}

// check parses and checks the flags and settles the isolation. It fails
// closed: unset, it is contained, and a machine that cannot contain stops
// the worker (exit 1) with what is missing and how to allow none; only a
// worker whose default sandbox is Cloudflare then starts, without local
// sandboxes. none is only ever what the operator set, and is warned about
// at every start. A bad value is a usage error (exit 2).
func (c *containOptions) check(sbName string, log zerolog.Logger) (code int, err error) {
	if code, err := c.checkValues(); err != nil {
		return code, err
	}
	switch c.isolation {
	case "":
		why := sandbox.CheckContained()
		if why == nil {
			c.isolation = sandbox.IsolationContained
			break
		}
		if sbName == protocol.SandboxCloudflare {
			c.noLocal = true
			log.Warn().Str("why", why.Error()).Msg("local sandboxes are off: this machine cannot contain them; " +
				"jobs asking for sandbox local fail here (" + noneHint + ")")
			return 0, nil
		}
		return 1, fmt.Errorf("local sandboxes cannot be contained here, so the worker does not start: %w; %s", why, noneHint)
	case sandbox.IsolationContained:
		if err := sandbox.CheckContained(); err != nil {
			return 1, fmt.Errorf("--isolation contained is not available here: %w; %s", err, noneHint)
		}
	case sandbox.IsolationNone:
		log.Warn().Str("isolation", c.isolation).Int("worker_uid", os.Geteuid()).
			Msg("--isolation none: local agents are NOT contained; they run as the worker's user and can read what it reads (its NATS credentials, storage, journal) and reach what it reaches")
	default:
		return 2, fmt.Errorf("--isolation must be %s or %s, not %q", sandbox.IsolationContained, sandbox.IsolationNone, c.isolation)
	}
	log.Info().Str("isolation", c.isolation).Int("agent_uid", c.agentUID).
		Str("network_default", c.defaultNet.String()).Str("network_max", c.maxNet.String()).Str("egress_allow_private", c.egressDeny.String()).Msg("local sandbox isolation")
	return 0, nil
}

// noneHint is how an operator runs uncontained agents on purpose.
const noneHint = "to run local agents uncontained instead, as the worker's user (they can read its NATS credentials and data), " +
	"set --isolation none or FLEET_ISOLATION=none explicitly"

// checkValues parses and checks every flag but --isolation (exit 2).
func (c *containOptions) checkValues() (code int, err error) {
	if c.agentUID <= 0 {
		return 2, fmt.Errorf("--agent-uid must be a positive uid (never 0), not %d", c.agentUID)
	}
	if c.defaultNet, err = egress.ParseFlag(c.netDefault); err != nil {
		return 2, fmt.Errorf("--network-default: %w", err)
	}
	if c.maxNet, err = egress.ParseMode(c.netMax); err != nil {
		return 2, fmt.Errorf("--network-max: %w", err)
	}
	if err := c.defaultNet.CheckMax(c.maxNet); err != nil {
		return 2, fmt.Errorf("--network-default is above --network-max: %w", err)
	}
	if c.egressDeny, err = egress.ParseAllow(c.egressAllow); err != nil {
		return 2, err
	}
	if err := c.defaultNet.CheckDeny(c.egressDeny); err != nil {
		return 2, fmt.Errorf("--network-default: %w", err)
	}
	if c.memMB < 0 || c.memMaxMB < 0 || c.pids < 0 || c.pidsMax < 0 || c.cpuWeight < 0 || c.cpuWeightMax < 0 {
		return 2, fmt.Errorf("--limit-* must not be negative")
	}
	c.limitsDefault = sandbox.Limits{MemoryBytes: c.memMB << 20, Pids: c.pids, CPUWeight: c.cpuWeight}
	c.limitsMax = sandbox.Limits{MemoryBytes: c.memMaxMB << 20, Pids: c.pidsMax, CPUWeight: c.cpuWeightMax}
	if err := c.limitsDefault.Within(c.limitsMax); err != nil {
		return 2, fmt.Errorf("--limit-* defaults are above their maximums: %w", err)
	}
	return 0, nil
}

// networkConfig is the worker's NetworkConfig. The model URL is the model
// gateway's when there is one, else the ANTHROPIC_BASE_URL the worker
// gives its agents (--agent-env; only without a gateway), which a
// contained agent reaches through a forward; an https one (the API itself)
// cannot be forwarded, and a contained agent whose network does not reach
// it has no model: say so once at start.
func (c *containOptions) networkConfig(agentEnv []string, gw *gateway.Gateway, log zerolog.Logger) worker.NetworkConfig {
	n := worker.NetworkConfig{Default: c.defaultNet, Max: c.maxNet, Deny: c.egressDeny}
	if gw != nil {
		// The model gateway (docs/gateway.md), on this machine's loopback: a
		// contained agent reaches it through the model forward.
		n.ModelURL = gw.URL()
		return n
	}
	if !slices.Contains(agentEnv, "ANTHROPIC_BASE_URL") {
		return n
	}
	raw := os.Getenv("ANTHROPIC_BASE_URL")
	if raw == "" {
		return n
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme == "http" && u.Host != "" {
		n.ModelURL = raw
	} else if c.isolation == sandbox.IsolationContained {
		log.Warn().Msg("ANTHROPIC_BASE_URL is not an http:// address the worker can forward: contained agents reach it only with network open (or an allow entry for its host)")
	}
	return n
}
