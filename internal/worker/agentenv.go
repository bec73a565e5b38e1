package worker

import (
	"slices"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// agentEnv is the one place where the worker decides what a job adds to
// its agent's environment: options.env, each name in the operator's
// allow-list (Config.EnvAllow). What the worker's own environment gives
// the agent is the sandbox provider's (its EnvAllow; package sandbox
// strips the worker's secrets, sandbox.DeniedEnv), and the process spec
// is built from the job by the mode (agent.Request for a one-shot run,
// session.Spec for a session). A variable not allowed is a validation
// error naming it: the job is invalid.
func agentEnv(job *protocol.Job, allow []string) (map[string]string, error) {
	if len(job.Options.Env) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(job.Options.Env))
	for k, v := range job.Options.Env {
		if !slices.Contains(allow, k) {
			return nil, &protocol.ValidationError{Field: "options.env." + k, Reason: "not in the operator's allow-list"}
		}
		env[k] = v
	}
	return env, nil
}
