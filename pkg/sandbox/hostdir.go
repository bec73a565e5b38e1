package sandbox

// HostWorkDir is implemented by sandboxes whose working directory is a
// directory of this machine (the local provider's, contained or not).
// Parts of the worker that prepare a workspace from outside the sandbox
// (the repository cache, docs/warm.md) use it; the agent never sees the path.
type HostWorkDir interface {
	HostWorkDir() string
}

// HostWorkDir is the sandbox's working directory on this machine.
func (s *localSandbox) HostWorkDir() string { return s.work }
