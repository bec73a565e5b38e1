package sandbox

import "fmt"

// SpawnError reports that a process could not be started at all: its program
// was not found in the child's PATH, was not executable, or exec failed.
// It matches ErrInvalid with errors.Is (retrying will not help), and callers
// that must tell a spawn failure from a bad request (the agent runner reports
// the reason "spawn_failed") use errors.As.
type SpawnError struct {
	// Sandbox is the sandbox ID.
	Sandbox string
	// Process is the process ID from ProcSpec.
	Process string
	// Program is Argv[0] as given.
	Program string
	// Err is the cause (for example exec.ErrNotFound or a *os.PathError).
	Err error
}

// Error implements error.
func (e *SpawnError) Error() string {
	return fmt.Sprintf("sandbox: start process %s in sandbox %s: spawn %q: %v", e.Process, e.Sandbox, e.Program, e.Err)
}

// Unwrap returns the cause.
func (e *SpawnError) Unwrap() error { return e.Err }

// Is reports that a SpawnError is an ErrInvalid.
func (e *SpawnError) Is(target error) bool { return target == ErrInvalid }
