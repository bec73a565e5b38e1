package worker

// What a valid job needs before its attempt starts: the environment it
// adds to its agent's, the sandbox provider that runs it, and its mode.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// agentEnv is the one place where the worker decides what a job adds to
// its agent's environment: options.env, each name in the operator's
// allow-list (Config.EnvAllow). What the worker's own environment gives
// the agent is the sandbox provider's (its EnvAllow; package sandbox
// strips the worker's secrets, sandbox.DeniedEnv), and the process spec
// is built from the job by the mode (agent.Request for a one-shot run,
// session.Spec for a session); with a model gateway the metered mode
// (model.go) adds its URL and the run's token. A variable not allowed, or
// one of the model's (ReservedModelEnv), is a validation error naming it:
// the job is invalid.
func agentEnv(job *protocol.Job, allow []string) (map[string]string, error) {
	if len(job.Options.Env) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(job.Options.Env))
	for k, v := range job.Options.Env {
		if ReservedModelEnv(k) {
			return nil, &protocol.ValidationError{Field: "options.env." + k,
				Reason: "is the worker's to set (the model gateway's URL and the run's token); a job never sets a model credential"}
		}
		if !slices.Contains(allow, k) {
			return nil, &protocol.ValidationError{Field: "options.env." + k, Reason: "not in the operator's allow-list"}
		}
		env[k] = v
	}
	return env, nil
}

// providerFor returns the sandbox provider that runs job: this worker's, a
// missingProvider when no worker of the fleet has it, or nil when another
// worker does (Config.OtherSandboxes) and the job must be handed back.
func providerFor(cfg Config, job *protocol.Job) sandbox.Provider {
	name := cmp.Or(job.Sandbox, cfg.DefaultSandbox)
	if p := cfg.Providers[name]; p != nil {
		return p
	}
	if slices.Contains(cfg.OtherSandboxes, name) {
		return nil
	}
	return missingProvider{name: name, have: slices.Sorted(maps.Keys(cfg.Providers))}
}

// missingProvider stands for a provider no worker of the fleet has. Its
// Create fails for good, so the run ends at once through the runner's
// spawn-failure path: a failed status (spawn_failed) and a synthetic result
// whose message names the provider, instead of redeliveries until
// max_deliveries with the reason only in worker logs.
type missingProvider struct {
	name string
	have []string
}

func (m missingProvider) Name() string { return m.name }

func (m missingProvider) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return nil, errMissingProvider{fmt.Sprintf("sandbox %q is not configured on this worker (it has %s) and no other worker of the fleet is declared to have it (worker --other-sandboxes)",
		m.name, strings.Join(m.have, ", "))}
}

// errMissingProvider is a sandbox.ErrInvalid whose message is only its own.
type errMissingProvider struct{ msg string }

func (e errMissingProvider) Error() string        { return e.msg }
func (e errMissingProvider) Is(target error) bool { return target == sandbox.ErrInvalid }

// newMode is the mode of q's job; env is what the job adds to its agent's
// environment (agentEnv).
func newMode(q *query, env map[string]string) mode {
	if env == nil {
		env = map[string]string{}
	}
	var m mode
	if q.job.Session != nil {
		m = &sessionRun{q: q, env: env, log: q.log.With().Str("session", "true").Logger()}
	} else {
		m = &oneShot{q: q, env: env}
	}
	switch provider := cmp.Or(q.job.Sandbox, q.w.cfg.DefaultSandbox); {
	case q.w.cfg.Gateway != nil && provider == protocol.SandboxLocal:
		m = &meteredMode{mode: m, q: q, env: env}
	case provider == protocol.SandboxCloudflare:
		// A Cloudflare sandbox cannot reach the worker's loopback: its
		// bridge meters at its egress (bridgemodel.go, docs/gateway.md).
		m = &bridgeMeteredMode{mode: m, q: q}
	}
	if t := q.w.cfg.Test; t.RunStarted != nil || t.RunEnded != nil {
		m = hooked{mode: m, q: q}
	}
	if q.job.Setup != "" {
		m = &setupMode{mode: m, q: q}
	}
	if q.job.Workspace != nil {
		m = &workspaceMode{mode: m, q: q}
	}
	return m
}

// reservedIn returns the first name of names a job may never set
// (ReservedModelEnv), or "".
func reservedIn(names []string) string {
	for _, n := range names {
		if ReservedModelEnv(n) {
			return n
		}
	}
	return ""
}
