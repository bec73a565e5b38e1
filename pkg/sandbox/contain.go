package sandbox

import "os/exec"

// Containment modes of Local (LocalConfig.Containment): how Local finds and
// ends the processes a run started that left its process group (setsid,
// double fork), which a process-group kill never reaches.
const (
	// ContainAuto picks ContainCgroup when this machine lets the worker
	// create cgroup v2 groups, else ContainEnviron (ContainGroup where
	// neither exists: not Linux).
	ContainAuto = "auto"
	// ContainCgroup puts each process in a cgroup v2 group of its own, which
	// every descendant inherits and cannot leave without privileges, and
	// kills the group with cgroup.kill.
	ContainCgroup = "cgroup"
	// ContainEnviron marks each process with a random token in its
	// environment (AGENTFLEET_RUN), which descendants inherit, and kills
	// every process on the machine that carries it, found through /proc.
	ContainEnviron = "environ"
	// ContainGroup only kills the process group (the behaviour on systems
	// without /proc).
	ContainGroup = "group"
)

// runMarkerEnv names the variable that marks every process of one run in
// ContainEnviron mode.
const runMarkerEnv = "AGENTFLEET_RUN"

// containment creates the per-process containment of one mode.
type containment interface {
	// mode is one of the Contain* constants (never ContainAuto).
	mode() string
	// newRun prepares the containment of a process about to start.
	newRun(sandboxID, procID string) (containedRun, error)
}

// containedRun contains one process and everything it starts.
type containedRun interface {
	// prepare adjusts cmd before it starts (SysProcAttr, Env).
	prepare(cmd *exec.Cmd)
	// startFailed is called when cmd.Start failed; it reports whether the
	// start is worth retrying with a fresh cmd (passed to prepare again),
	// because the way prepare chose is not supported here.
	startFailed(err error) bool
	// started is called once the process runs.
	started(pid int) error
	// killAll kills every process of the run that is still alive and
	// returns once they are gone (bounded). It returns how many it found.
	killAll() (int, error)
	// release frees what newRun made. Called once, after killAll, or after
	// a failed start.
	release()
}

// groupOnly is ContainGroup: nothing beyond the process group.
type groupOnly struct{}

func (groupOnly) mode() string                                { return ContainGroup }
func (groupOnly) newRun(string, string) (containedRun, error) { return groupRun{}, nil }

type groupRun struct{}

func (groupRun) prepare(*exec.Cmd)      {}
func (groupRun) startFailed(error) bool { return false }
func (groupRun) started(int) error      { return nil }
func (groupRun) killAll() (int, error)  { return 0, nil }
func (groupRun) release()               {}
