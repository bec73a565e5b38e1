package worker

// What a job's agent may reach (docs/contained.md): the job's `network` decided
// before anything of the run exists, and the model's address carried into
// a contained sandbox through a forward.

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// NetworkConfig is what the worker lets jobs' agents reach (docs/contained.md).
type NetworkConfig struct {
	// Default is the policy of a job without `network` (--network-default);
	// the zero value is egress.None.
	Default egress.Policy
	// Max is the most a job may ask for (--network-max); a job asking more
	// fails with network_not_allowed. The zero value is egress.None.
	Max egress.Mode
	// Deny is the egress deny-list (--egress-allow-private): a job naming
	// a denied address fails with network_not_allowed, and the proxy
	// refuses one a name resolves to. The zero value denies every range
	// of egress.DeniedRanges.
	Deny egress.Deny
	// ModelURL is the model base URL the agent is given (ANTHROPIC_BASE_URL:
	// the model gateway's, or what the worker's environment gives agents).
	// A contained agent reaches it through a forward (agentBaseURL).
	// Empty: the agent's ANTHROPIC_BASE_URL is left as it is.
	ModelURL string
}

// ModelForwardPort is the loopback port inside a contained sandbox that
// reaches the model (NetworkConfig.ModelURL).
const ModelForwardPort = 18080

// errNetworkNotEnforced is a Cloudflare job asking for a network its
// sandbox cannot enforce.
type errNetworkNotEnforced struct{ asked egress.Mode }

func (e errNetworkNotEnforced) Error() string {
	return fmt.Sprintf("network: the job asks for %q and a cloudflare sandbox cannot enforce it (only \"open\" runs there)", e.asked)
}

// jobNetwork is the network policy of job, decided before its sandbox is
// created. Errors are the job's failure: invalid (egress.ErrInvalid), or
// not allowed here (rejectCode gives network_not_allowed). A Cloudflare
// job may only ask for "open" (its sandbox has the platform's network); one
// without `network` runs there unenforced.
func (w *Worker) jobNetwork(job *protocol.Job) (egress.Policy, error) {
	p, err := egress.ForJob(job.Network, w.cfg.Network.Default, w.cfg.Network.Max, w.cfg.Network.Deny)
	if err != nil {
		return egress.Policy{}, err
	}
	if cmp.Or(job.Sandbox, w.cfg.DefaultSandbox) == protocol.SandboxCloudflare && len(job.Network) > 0 && p.Mode != egress.Open {
		return egress.Policy{}, errNetworkNotEnforced{p.Mode}
	}
	return p, nil
}

// rejectCode is the status error code of a job rejected for cause.
func rejectCode(cause error) string {
	var ne errNetworkNotEnforced
	if egress.IsNotAllowed(cause) || errors.As(cause, &ne) {
		return egress.Code
	}
	var nl errLimitsNotAllowed
	if errors.As(cause, &nl) {
		return protocol.CodeLimitsNotAllowed
	}
	return protocol.CodeInvalidJob
}

// containedProvider is the local provider's report of its isolation.
type containedProvider interface{ Contained() bool }

// withNetwork adds the job's network to its sandbox spec: the policy,
// the model forward and the agent's ANTHROPIC_BASE_URL through it, and
// refusals published on the query's .egress subject. The job's network was
// checked when it was taken (jobNetwork), so an error here cannot happen
// for a job that reached the run; it is logged and the spec left as is.
func (q *query) withNetwork(provider sandbox.Provider, spec sandbox.Spec) sandbox.Spec {
	w := q.w
	p, err := w.jobNetwork(q.job)
	if err != nil {
		q.log.Error().Err(err).Msg("the job's network, accepted when it was taken, is refused now")
		return spec
	}
	subject := w.names.QueryEgress(q.job.Tenant, q.job.ID)
	n := &sandbox.Network{Policy: p, Deny: w.cfg.Network.Deny, OnRefused: func(r egress.Refusal) {
		b, _ := json.Marshal(r)
		// Core NATS publish: buffered, never waits on the server.
		if err := w.cfg.NC.Publish(subject, b); err != nil {
			q.log.Warn().Err(err).Msg("publishing an egress refusal")
		}
	}}
	spec.Network = n
	if w.cfg.Network.ModelURL == "" {
		return spec
	}
	cp, ok := provider.(containedProvider)
	base, err := agentBaseURL(w.cfg.Network.ModelURL, n, ok && cp.Contained())
	if err != nil {
		q.log.Warn().Err(err).Msg("the model URL cannot be forwarded; the agent keeps its ANTHROPIC_BASE_URL")
		return spec
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["ANTHROPIC_BASE_URL"] = base
	spec.Env = env
	return spec
}

// agentBaseURL is the one place the agent's model address is made: it adds
// to n the forward (ModelForwardPort inside) to modelURL's host, and
// returns the base URL the agent is given: "http://" + n.Reach(forward,
// contained) + modelURL's path. Without containment (or with an open
// network) the agent dials modelURL's own address. The model gateway's
// wiring passes its per-run URL here. modelURL must be http:// (the
// gateway's, on this machine): a forward carries bytes, and TLS to
// 127.0.0.1 would not verify.
func agentBaseURL(modelURL string, n *sandbox.Network, contained bool) (string, error) {
	u, err := url.Parse(modelURL)
	if err != nil {
		return "", fmt.Errorf("model URL: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return "", fmt.Errorf("model URL %q: want http://host:port (a forward carries plain HTTP)", modelURL)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	fwd := sandbox.Forward{Port: ModelForwardPort, To: host}
	if n.Policy.Mode != egress.Open {
		n.Forwards = append(n.Forwards, fwd)
	}
	reach := n.Reach(fwd, contained)
	if !contained || n.Policy.Mode == egress.Open {
		reach = u.Host
	}
	out := url.URL{Scheme: "http", Host: reach, Path: u.Path, RawQuery: u.RawQuery}
	return out.String(), nil
}

// agentModelURL is what q's agent is given as ANTHROPIC_BASE_URL for
// modelURL, the model gateway's address on this machine (whose forward
// withNetwork made, Config.Network.ModelURL being that address): the
// forward's loopback address inside a contained sandbox with a network of
// its own, modelURL itself otherwise. The gateway's wiring sets the
// agent's variable from it, never from the gateway's address directly.
func (q *query) agentModelURL(modelURL string) string {
	p, err := q.w.jobNetwork(q.job)
	if err != nil {
		return modelURL
	}
	cp, ok := providerFor(q.w.cfg, q.job).(containedProvider)
	u, err := agentBaseURL(modelURL, &sandbox.Network{Policy: p}, ok && cp.Contained())
	if err != nil {
		return modelURL
	}
	return u
}
