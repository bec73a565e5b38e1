package sandbox

import "strings"

// deniedEnvPrefixes and deniedEnvNames form the deny-list applied, last, to
// every environment a provider hands to a sandboxed process. Compared
// case-insensitively.
var (
	deniedEnvPrefixes = []string{
		"FLEET_",      // the worker's own configuration: FLEET_NATS_CREDS, FLEET_CF_BRIDGE_TOKEN, FLEET_STORAGE …
		"NATS_",       // NATS credentials and URLs
		"AWS_",        // R2 / S3 keys (the standard AWS environment)
		"R2_",         // R2 keys under their own names
		"CLOUDFLARE_", // CLOUDFLARE_API_TOKEN for Workers KV
		"CF_",         // Cloudflare tokens under short names
	}
	deniedEnvNames = []string{
		"CLAUDECODE", // makes a child claude believe it runs inside a Claude Code parent
	}
)

// DeniedEnv reports whether the environment variable name must never reach a
// sandboxed process, whatever an allow-list, Spec.Env or ProcSpec.Env say.
// The deny-list holds CLAUDECODE and every name starting with FLEET_, NATS_,
// AWS_, R2_, CLOUDFLARE_ or CF_ (the worker's secrets and configuration),
// compared case-insensitively. Every provider applies it last; a provider
// may deny more (Cloudflare also denies token-like names, see
// DeniedEnvName), but never less.
func DeniedEnv(name string) bool {
	n := strings.ToUpper(name)
	for _, d := range deniedEnvNames {
		if n == d {
			return true
		}
	}
	for _, p := range deniedEnvPrefixes {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// checkEnvName returns an error wrapping ErrInvalid if name cannot be an
// environment variable name.
func checkEnvName(name string) error {
	if name == "" || strings.ContainsAny(name, "=\x00") {
		return Invalidf("environment variable name %q is empty or holds '=' or NUL", name)
	}
	return nil
}

// checkEnv validates the names and values of env.
func checkEnv(env map[string]string) error {
	for k, v := range env {
		if err := checkEnvName(k); err != nil {
			return err
		}
		if strings.ContainsRune(v, 0) {
			return Invalidf("environment variable %s holds a NUL byte", k)
		}
	}
	return nil
}

// checkID validates a sandbox or process ID: [A-Za-z0-9_-], 1 to 128 bytes.
// what ("sandbox ", "process " or "") prefixes "ID" in the message.
func checkID(what, id string) error {
	if id == "" || len(id) > 128 {
		return Invalidf("%sID %q must be 1 to 128 bytes", what, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return Invalidf("%sID %q may hold only [A-Za-z0-9_-]", what, id)
		}
	}
	return nil
}

// CheckID returns an error wrapping ErrInvalid unless id is a valid sandbox
// or process ID: 1 to 128 bytes of [A-Za-z0-9_-]. Providers call it so every
// provider accepts the same IDs.
func CheckID(id string) error { return checkID("", id) }
