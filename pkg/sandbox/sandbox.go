package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Provider creates sandboxes. Local and Cloudflare implement it.
type Provider interface {
	// Name is the provider name used in jobs and flags ("local", "cloudflare").
	Name() string
	// Create creates (or wakes) the sandbox named spec.ID. It may take long
	// (cloud cold starts); the caller bounds it with ctx. Errors: ErrUnavailable
	// (retryable), ErrInvalid.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID names the sandbox; [A-Za-z0-9_-], at most 128 bytes.
	ID string
	// Env is extra environment for every process of the sandbox, already
	// filtered by the caller's allow-list. Never put worker secrets here.
	Env map[string]string
	// Network is the Network of every process of the sandbox whose
	// ProcSpec.Network is nil (the worker decides it once per job).
	Network *Network
	// Limits are the Limits of every process of the sandbox whose
	// ProcSpec.Limits is zero (the job's, decided once per job).
	Limits Limits
}

// Sandbox is one isolated place to run processes and keep files.
type Sandbox interface {
	// ID is the sandbox's name.
	ID() string
	// Start starts a process from argv (never through a shell). Errors:
	// ErrInvalid (bad argv, cwd), ErrUnavailable, ErrClosed.
	Start(ctx context.Context, spec ProcSpec) (Process, error)
	// WriteFile writes a file at a path relative to the sandbox workspace.
	// Paths that escape the workspace give ErrInvalid.
	WriteFile(ctx context.Context, path string, data []byte) error
	// ReadFile reads a file relative to the workspace; ErrNotFound if absent.
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// Destroy stops every process and removes the sandbox. Idempotent.
	Destroy(ctx context.Context) error
}

// ProcSpec describes a process to start.
type ProcSpec struct {
	// ID names the process inside the sandbox (idempotency key for remote providers).
	ID string
	// Argv is the program and its arguments; Argv[0] is looked up in PATH.
	Argv []string
	// Env is extra environment on top of the sandbox's (already filtered).
	Env map[string]string
	// Dir is the working directory relative to the workspace ("" = workspace root).
	Dir string
	// Stdin is written to the process's stdin, which is then closed.
	Stdin []byte
	// Stderr, if set, receives stderr as it is produced (in addition to the
	// kept tail). It must not block for long.
	Stderr io.Writer
	// StderrTailBytes is how much stderr to keep for ExitStatus.StderrTail.
	// Defaults to 8 KiB.
	StderrTailBytes int
	// Network is what the process may reach under IsolationContained; nil
	// is egress.None with no forwards. Other isolations ignore it.
	Network *Network
	// Limits are the process's cgroup v2 limits under IsolationContained
	// (zero fields: the provider's defaults).
	Limits Limits
}

// Process is a running process.
type Process interface {
	// ID is the process ID given in ProcSpec.
	ID() string
	// Stdout streams the process's stdout as it is produced; io.EOF once the
	// process has closed it. Read it to EOF: the provider never buffers
	// without bound, so an unread stdout stalls the process.
	Stdout() io.Reader
	// Wait waits for exit. It returns the exit status; an error only when the
	// status could not be learned (ctx done, transport failure: ErrUnavailable).
	Wait(ctx context.Context) (ExitStatus, error)
	// Stop asks the process (group) to exit, waits up to grace, then kills it.
	// It returns ErrExited if it had already exited.
	Stop(ctx context.Context, grace time.Duration) error
}

// Interactive is an optional ability of a Sandbox (like nomad's optional
// ExecTaskStreamingDriver): it starts a process whose stdin stays open, for
// a caller that talks to it over time (sessions, docs/sessions.md). Check for it with
// a type assertion; a provider without it cannot run sessions.
type Interactive interface {
	// StartInteractive starts a process like Start, but its stdin is a pipe
	// the caller writes to (ProcSpec.Stdin must be empty). Errors as Start.
	StartInteractive(ctx context.Context, spec ProcSpec) (InteractiveProcess, error)
}

// InteractiveProcess is a running process whose stdin the caller holds.
type InteractiveProcess interface {
	Process
	// Stdin is the process's stdin. Writes are delivered in order; a write
	// blocks while the process does not read. Close sends EOF. Writes after
	// the process exited fail with an error wrapping ErrExited.
	Stdin() io.WriteCloser
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit code, or -1 when killed by a signal.
	Code int
	// Signal names the signal that killed it ("SIGKILL"), or "".
	Signal string
	// StderrTail is the last bytes of stderr.
	StderrTail string
}

// Sentinel errors. Compare with errors.Is.
var (
	ErrNotFound    = errors.New("sandbox: not found")
	ErrExited      = errors.New("sandbox: process already exited")
	ErrUnavailable = errors.New("sandbox: unavailable")
	ErrInvalid     = errors.New("sandbox: invalid request")
	ErrClosed      = errors.New("sandbox: closed")
)

// Retryable reports whether err is worth retrying on another attempt
// (the sandbox service was unavailable).
func Retryable(err error) bool { return errors.Is(err, ErrUnavailable) }

// Invalidf returns an error wrapping ErrInvalid.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// CPUMeter is an optional ability of a Sandbox: the CPU time (user and
// system) its running processes and what they started have used so far.
// Callers compare two readings to learn whether anything in the sandbox
// ran in between; the value may go down when a process exits. Errors:
// ErrUnavailable when the provider cannot measure it here.
type CPUMeter interface {
	CPUTime() (time.Duration, error)
}
