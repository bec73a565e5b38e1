package sandbox

import (
	"fmt"
	"net"
	"strconv"

	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// Isolation modes of Local (LocalConfig.Isolation, the worker's
// --isolation).
const (
	// IsolationNone runs each process as a plain child of the worker, as
	// the worker's user (not a security boundary).
	IsolationNone = "none"
	// IsolationContained runs each process in Linux namespaces through
	// bubblewrap (docs/contained.md): see the package documentation.
	IsolationContained = "contained"
)

// DefaultAgentUID is the uid an agent runs as inside a contained sandbox.
const DefaultAgentUID = 1000

// ProxyPort is the port of the egress proxy inside a contained sandbox
// whose network policy is egress.Allow: HTTP_PROXY is
// http://127.0.0.1:ProxyPort there.
const ProxyPort = 3128

// Limits are the cgroup v2 limits of one contained process and everything
// it starts. Zero fields take LocalConfig.DefaultLimits; a field above
// LocalConfig.MaxLimits is an error.
type Limits struct {
	// MemoryBytes is memory.max (bytes).
	MemoryBytes int64
	// Pids is pids.max.
	Pids int
	// CPUWeight is cpu.weight (1 to 10000; 100 is the kernel's default).
	CPUWeight int
}

// Within checks limits a job asks for against a provider's maximums (a
// zero field of max is no maximum): the worker refuses a job asking more
// before any process starts. Errors wrap ErrInvalid and name the limit.
func (l Limits) Within(max Limits) error {
	_, err := l.resolve(Limits{}, max)
	return err
}

// resolve fills zero fields from def and checks them against max (a zero
// field of max is no maximum).
func (l Limits) resolve(def, max Limits) (Limits, error) {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = def.Pids
	}
	if l.CPUWeight == 0 {
		l.CPUWeight = def.CPUWeight
	}
	switch {
	case l.MemoryBytes < 0 || l.Pids < 0 || l.CPUWeight < 0:
		return l, Invalidf("limits must not be negative")
	case l.CPUWeight > 10000:
		return l, Invalidf("CPU weight %d is above 10000", l.CPUWeight)
	case max.MemoryBytes > 0 && l.MemoryBytes > max.MemoryBytes:
		return l, Invalidf("memory limit %d bytes is above this worker's maximum %d", l.MemoryBytes, max.MemoryBytes)
	case max.Pids > 0 && l.Pids > max.Pids:
		return l, Invalidf("pids limit %d is above this worker's maximum %d", l.Pids, max.Pids)
	case max.CPUWeight > 0 && l.CPUWeight > max.CPUWeight:
		return l, Invalidf("CPU weight %d is above this worker's maximum %d", l.CPUWeight, max.CPUWeight)
	}
	return l, nil
}

// Network is what a contained process may reach (ProcSpec.Network).
// IsolationNone does not enforce it: the process reaches what the worker
// reaches.
type Network struct {
	// Policy is the job's decoded `network` value. egress.None: only
	// Forwards. egress.Allow: Forwards, plus the egress proxy at
	// 127.0.0.1:ProxyPort (HTTP_PROXY, HTTPS_PROXY, http_proxy, https_proxy
	// are set; NO_PROXY is 127.0.0.1, so forwards are reached directly).
	// egress.Open: the worker's own network namespace.
	Policy egress.Policy
	// Deny is the worker's egress deny-list the proxy enforces whatever
	// Policy admits (--egress-allow-private); the zero value refuses every
	// range of egress.DeniedRanges.
	Deny egress.Deny
	// Forwards are ports inside the sandbox's loopback that reach a host
	// address (the model gateway), in every mode but Open.
	Forwards []Forward
	// OnRefused, if set, is called once per (host, port) the proxy refused
	// (publish it on `.egress`). It must not block for long.
	OnRefused func(egress.Refusal)
}

// Forward makes 127.0.0.1:Port inside the sandbox reach To (host:port) in
// the worker's network namespace.
type Forward struct {
	Port int
	To   string
}

// Reach is the address a process in a sandbox with this network dials to
// reach f: 127.0.0.1:Port inside its own network namespace, or f.To itself
// when it shares the worker's (egress.Open, or IsolationNone: pass
// isolated false).
func (n *Network) Reach(f Forward, isolated bool) string {
	if !isolated || n == nil || n.Policy.Mode == egress.Open {
		return f.To
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.Port))
}

func (n *Network) check() error {
	if n == nil {
		return nil
	}
	seen := map[int]bool{}
	for i, f := range n.Forwards {
		if f.Port < 1 || f.Port > 65535 || f.Port == ProxyPort && n.Policy.Mode == egress.Allow || seen[f.Port] {
			return Invalidf("Network.Forwards[%d]: port %d is out of range or taken", i, f.Port)
		}
		seen[f.Port] = true
		if _, _, err := net.SplitHostPort(f.To); err != nil {
			return Invalidf("Network.Forwards[%d]: %q is not host:port", i, f.To)
		}
	}
	if n.Policy.Mode == egress.Allow && len(n.Policy.Allow) == 0 {
		return Invalidf("Network.Policy: allow with no entries")
	}
	return nil
}

// proxyEnv is the environment of a process behind the egress proxy.
func proxyEnv(env map[string]string) {
	u := fmt.Sprintf("http://127.0.0.1:%d", ProxyPort)
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env[k] = u
	}
	// Only the forwards' address: "localhost:8080" on an allow list means
	// the worker host's, reached through the proxy.
	env["NO_PROXY"] = "127.0.0.1"
	env["no_proxy"] = env["NO_PROXY"]
}
