package worker

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
