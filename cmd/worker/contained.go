package main

// The worker's contained sandboxes (docs/contained.md): --isolation, --agent-uid,
// --network-default, --network-max.

import (
	"fmt"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"net/url"
	"os"
	"slices"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// containOptions are the containment flags (docs/contained.md), and what
// they parse into.
type containOptions struct {
	isolation          string
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
	fs.StringVar(&c.isolation, "isolation", "", "local sandboxes: contained (bubblewrap namespaces) or none (a plain child process); default contained where this machine supports it (env FLEET_ISOLATION)")
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

// check parses and checks the flags and settles the isolation: unset, the
// default (contained where it works, else none, logged with the reason);
// contained asked for where it cannot work is exit 1 with what is missing.
// A bad value is a usage error (exit 2).
func (c *containOptions) check(log zerolog.Logger) (code int, err error) {
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
	switch c.isolation {
	case "":
		var why error
		c.isolation, why = sandbox.DefaultIsolation()
		if why != nil {
			log.Warn().Str("isolation", c.isolation).Str("why", why.Error()).
				Msg("local sandboxes are not contained: agents run as the worker's user and reach what it reaches")
			return 0, nil
		}
	case sandbox.IsolationContained:
		if err := sandbox.CheckContained(); err != nil {
			return 1, fmt.Errorf("--isolation contained is not available here: %w", err)
		}
	case sandbox.IsolationNone:
	default:
		return 2, fmt.Errorf("--isolation must be %s or %s, not %q", sandbox.IsolationContained, sandbox.IsolationNone, c.isolation)
	}
	log.Info().Str("isolation", c.isolation).Int("agent_uid", c.agentUID).
		Str("network_default", c.defaultNet.String()).Str("network_max", c.maxNet.String()).Str("egress_allow_private", c.egressDeny.String()).Msg("local sandbox isolation")
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
