package envcache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// MaxSetupLine is the longest output line handed on; a longer one is cut
// into pieces of this size.
const MaxSetupLine = 64 << 10

// setupShell runs the script given as $1 with sh -e, stderr merged into
// stdout so lines come in the order the script wrote them.
const setupShell = `exec 2>&1; exec sh -e -c "$1" fleet-setup`

// SetupError is a setup script that failed: its exit status, or that it
// did not finish (ctx ended: the job's timeout, a cancel).
type SetupError struct {
	Code   int    // exit code, -1 when killed by a signal or not finished
	Signal string // the signal that killed it, or ""
	Cause  error  // set when it did not finish
}

func (e *SetupError) Error() string {
	switch {
	case e.Cause != nil:
		return "setup did not finish: " + e.Cause.Error()
	case e.Signal != "":
		return "setup was killed by " + e.Signal
	}
	return fmt.Sprintf("setup exited with status %d", e.Code)
}

func (e *SetupError) Unwrap() error { return e.Cause }

// RunSetup runs script with sh -e in dir (relative to the sandbox's
// workspace, "" for its root: the checkout), bounded by ctx, and calls
// line for every line of its output (stdout and stderr, in the order
// written, without the newline) from one goroutine. A script that exits
// non-zero or does not finish returns a *SetupError; an error of the
// sandbox (it could not start sh) is returned as is.
func RunSetup(ctx context.Context, sb sandbox.Sandbox, dir, script string, line func(string)) error {
	proc, err := sb.Start(ctx, sandbox.ProcSpec{
		ID:   "setup-" + random(),
		Argv: []string{"sh", "-c", setupShell, "fleet-setup-outer", script},
		Dir:  dir,
	})
	if err != nil {
		return fmt.Errorf("envcache: starting the setup: %w", err)
	}
	read := make(chan error, 1)
	go func() { read <- readLines(proc.Stdout(), line) }()
	select {
	case err = <-read:
	case <-ctx.Done():
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = proc.Stop(stopCtx, 5*time.Second)
		cancel()
		<-read //nolint:errcheck // the reader ends with the process; the hang is the error
		return &SetupError{Code: -1, Cause: context.Cause(ctx)}
	}
	st, werr := proc.Wait(context.WithoutCancel(ctx))
	if werr != nil {
		return fmt.Errorf("envcache: waiting for the setup: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("envcache: reading the setup's output: %w", err)
	}
	if st.Code != 0 || st.Signal != "" {
		return &SetupError{Code: st.Code, Signal: st.Signal}
	}
	return nil
}

// readLines hands on r's lines, cutting those over MaxSetupLine.
func readLines(r io.Reader, line func(string)) error {
	br := bufio.NewReaderSize(r, MaxSetupLine)
	for {
		b, err := br.ReadSlice('\n')
		if len(b) > 0 && !errors.Is(err, bufio.ErrBufferFull) {
			b = trimNewline(b)
		}
		if len(b) > 0 || err == nil {
			line(string(b))
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}
