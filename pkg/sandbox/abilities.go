package sandbox

// Optional abilities of a Sandbox, found with a type assertion (like
// nomad's optional driver interfaces). Callers must work without them.

// PrivateStdin is implemented by sandboxes whose ProcSpec.Stdin reaches the
// process through a pipe only, never written to a file or sent anywhere a
// later process of the sandbox could read it (Local). A caller may hand a
// short-lived secret to one process this way.
type PrivateStdin interface {
	PrivateStdin()
}

// GitCredentialsBrokered is implemented by sandboxes whose provider adds
// git credentials to outgoing requests itself, outside the sandbox
// (Cloudflare: the bridge Worker holds them and injects them on egress).
// Callers give such a sandbox no credentials.
type GitCredentialsBrokered interface {
	GitCredentialsBrokered()
}

// PrivateStdin marks Local: stdin is a pipe.
func (s *localSandbox) PrivateStdin() {}

// GitCredentialsBrokered marks Cloudflare: the bridge Worker holds git
// credentials (its GIT_CREDENTIALS secret) and adds them on egress.
func (s *cfSandbox) GitCredentialsBrokered() {}

// HostConfigDir is implemented by sandboxes whose CLAUDE_CONFIG_DIR is a
// directory of the worker's own host (Local). Package session reads and
// writes session transcripts there directly, through an os.Root (no
// symlink leads out of it), instead of by helper processes started in the
// sandbox (printenv, find, cat: three spawns after every run).
type HostConfigDir interface {
	HostConfigDir() string
}
