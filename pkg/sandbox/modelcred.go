package sandbox

import "strings"

// modelCredentialEnv names the variables that hold a model credential. The
// worker's own are its model gateway's (docs/gateway.md): the local provider never
// copies them from the worker's environment, whatever LocalConfig.EnvAllow
// lists. A process spec may still set ANTHROPIC_API_KEY: the worker puts
// the run's gateway token there.
var modelCredentialEnv = []string{"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN"}

// workerModelCredential reports whether name is one of modelCredentialEnv
// (any case).
func workerModelCredential(name string) bool {
	for _, c := range modelCredentialEnv {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	return false
}
