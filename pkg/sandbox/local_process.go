package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// localProcess is a child process of a localSandbox.
type localProcess struct {
	id, sandbox string
	cmd         *exec.Cmd
	run         containedRun    // what else the process started, however detached
	ct          *containedStart // IsolationContained: the bwrap launch; nil otherwise
	containMode string
	pid         int // also the process group ID
	log         zerolog.Logger
	waitDelay   time.Duration

	stdout     *procStdout
	stderrR    *os.File
	stderrCopy io.Writer
	tail       *tailBuffer
	stdinW     *os.File // nil when ProcSpec.Stdin was empty
	stdinOnce  sync.Once

	// mu orders signals against the leader's reaping: signals go to the group
	// only while exited is false, and exited is set before the leader is
	// reaped, so its PID (the group ID) cannot have been reused.
	mu     sync.Mutex
	exited bool

	leaderGone atomic.Bool // set once exited and the group was killed; readers then bound their waits
	status     ExitStatus  // written before done is closed
	statusErr  error       // written before done is closed

	done      chan struct{} // closed once the leader is reaped
	drained   chan struct{} // closed once stderr is drained
	stdinDone chan struct{} // closed once the stdin writer is done
}

var (
	_ Process            = (*localProcess)(nil)
	_ InteractiveProcess = (*localProcess)(nil)
	_ Interactive        = (*localSandbox)(nil)
)

// Stdin is the stdin pipe of an interactive process.
func (p *localProcess) Stdin() io.WriteCloser { return localStdin{p} }

type localStdin struct{ p *localProcess }

func (w localStdin) Write(b []byte) (int, error) {
	if w.p.stdinW == nil {
		return 0, fmt.Errorf("sandbox: process %s has no stdin: %w", w.p.id, ErrInvalid)
	}
	n, err := w.p.stdinW.Write(b)
	if err != nil {
		select {
		case <-w.p.done:
			return n, fmt.Errorf("sandbox: write stdin of process %s: %w", w.p.id, ErrExited)
		default:
		}
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return n, fmt.Errorf("sandbox: write stdin of process %s: %w: %v", w.p.id, ErrExited, err)
		}
		return n, fmt.Errorf("sandbox: write stdin of process %s: %w", w.p.id, err)
	}
	return n, nil
}

func (w localStdin) Close() error {
	w.p.closeStdin()
	return nil
}

// ID returns the process ID given in ProcSpec.
func (p *localProcess) ID() string { return p.id }

// Stdout returns the process's stdout. It reaches io.EOF once every holder
// of the pipe has closed it, or WaitDelay after the process exited if some
// process that left the group keeps it open without writing.
func (p *localProcess) Stdout() io.Reader { return p.stdout }

// waitLoop waits for the leader to exit, kills what remains of its process
// group, reaps it and records the exit status.
func (p *localProcess) waitLoop() {
	defer close(p.done)
	var werr error
	if err := waitExitedNoReap(p.pid); err == nil {
		p.markExited() // leader is a zombie: the group ID is still ours
		werr = p.cmd.Wait()
	} else {
		werr = p.cmd.Wait()
		p.markExited()
	}
	// The group is dead; now whatever left it (setsid, double fork).
	if n, err := p.run.killAll(); err != nil {
		p.log.Error().Err(err).Msg("processes the run started are still alive")
	} else if n > 0 {
		p.log.Info().Int("processes", n).Str("containment", p.containMode).
			Msg("killed processes the run left behind outside its process group")
	}
	p.run.release()
	p.ct.stop()
	p.leaderGone.Store(true)
	deadline := time.Now().Add(p.waitDelay)
	_ = p.stdout.f.SetReadDeadline(deadline)
	_ = p.stderrR.SetReadDeadline(deadline)
	p.closeStdin()

	ps := p.cmd.ProcessState
	if ps == nil {
		p.statusErr = fmt.Errorf("sandbox: wait process %s in sandbox %s: %w: %v", p.id, p.sandbox, ErrUnavailable, werr)
		return
	}
	p.status = exitStatus(ps)
	p.log.Debug().Int("code", p.status.Code).Str("signal", p.status.Signal).Msg("process exited")
}

// markExited records that the leader exited and SIGKILLs the rest of its
// group, so no descendant outlives the run.
func (p *localProcess) markExited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exited = true
	_ = syscall.Kill(-p.pid, syscall.SIGKILL) // ESRCH when the group is empty
}

// signalGroup sends sig to the process group; false if the leader had exited.
func (p *localProcess) signalGroup(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return false
	}
	if p.ct != nil && sig != syscall.SIGKILL {
		// bwrap passes no signal on: send it to the program's own group
		// inside (SIGKILL to bwrap ends the whole sandbox instead).
		if p.ct.signalAgent(sig) {
			return true
		}
	}
	_ = syscall.Kill(-p.pid, sig)
	return true
}

func exitStatus(ps *os.ProcessState) ExitStatus {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("SIG%d", int(ws.Signal()))
		}
		return ExitStatus{Code: -1, Signal: name}
	}
	return ExitStatus{Code: ps.ExitCode()}
}

// drainStderr reads stderr until EOF (or WaitDelay of silence after the
// leader exited) so the child never blocks on a full stderr pipe.
func (p *localProcess) drainStderr() {
	defer close(p.drained)
	defer func() { _ = p.stderrR.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := p.readBounded(p.stderrR, buf)
		if n > 0 {
			_, _ = p.tail.Write(buf[:n])
			if p.stderrCopy != nil {
				_, _ = p.stderrCopy.Write(buf[:n])
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				p.log.Warn().Msg("stderr still open after the process exited (a descendant left its process group); closed it")
			}
			return
		}
	}
}

// readBounded reads from one of the process's output pipes. Before the
// leader exits it blocks like any read. Afterwards each read waits at most
// WaitDelay for new data and returns os.ErrDeadlineExceeded when none came,
// which means a process outside the group holds the pipe open. Data already
// in the pipe is always returned, however late the read.
func (p *localProcess) readBounded(f *os.File, b []byte) (int, error) {
	if p.leaderGone.Load() {
		_ = f.SetReadDeadline(time.Now().Add(p.waitDelay))
	}
	n, err := f.Read(b)
	for errors.Is(err, os.ErrDeadlineExceeded) && pendingBytes(f) > 0 {
		// The deadline passed before the read looked at the pipe (a slow
		// reader, or a tiny WaitDelay); the data is there, so this read
		// does not block.
		_ = f.SetReadDeadline(time.Time{})
		n, err = f.Read(b)
	}
	return n, err
}

// writeStdin writes data to stdin and closes it. A child that exits (or
// closes stdin) without reading it gives EPIPE or ErrClosed, both ignored.
func (p *localProcess) writeStdin(data []byte) {
	defer close(p.stdinDone)
	_, err := p.stdinW.Write(data)
	p.closeStdin()
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, os.ErrClosed) {
		p.log.Debug().Err(err).Msg("writing stdin failed")
	}
}

func (p *localProcess) closeStdin() {
	if p.stdinW == nil {
		return
	}
	p.stdinOnce.Do(func() { _ = p.stdinW.Close() })
}

// Wait waits for the process to exit and for its stderr to be drained.
func (p *localProcess) Wait(ctx context.Context) (ExitStatus, error) {
	for _, ch := range []chan struct{}{p.done, p.drained} {
		select {
		case <-ch:
		case <-ctx.Done():
			return ExitStatus{}, fmt.Errorf("sandbox: wait process %s in sandbox %s: %w", p.id, p.sandbox, ctx.Err())
		}
	}
	if p.statusErr != nil {
		return ExitStatus{}, p.statusErr
	}
	st := p.status
	st.StderrTail = p.tail.String()
	return st, nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the leader
// to exit, then sends SIGKILL. With grace <= 0 it sends SIGKILL at once. If
// ctx ends first the group is killed and ctx's error returned. It returns
// ErrExited if the process had already exited.
func (p *localProcess) Stop(ctx context.Context, grace time.Duration) error {
	op := fmt.Sprintf("sandbox: stop process %s in sandbox %s", p.id, p.sandbox)
	sig := syscall.SIGKILL
	if grace > 0 {
		sig = syscall.SIGTERM
	}
	if !p.signalGroup(sig) {
		return fmt.Errorf("%s: %w", op, ErrExited)
	}
	p.log.Debug().Str("signal", unix.SignalName(sig)).Msg("stopping process")
	if sig == syscall.SIGTERM {
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return nil
		case <-timer.C:
			p.log.Debug().Msg("grace period over; killing process group")
			p.signalGroup(syscall.SIGKILL)
		case <-ctx.Done():
			p.signalGroup(syscall.SIGKILL)
			return fmt.Errorf("%s: %w", op, ctx.Err())
		}
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// shutdown stops the process if needed, waits for its goroutines, and
// closes its stdout. Used by Destroy.
func (p *localProcess) shutdown(ctx context.Context, grace time.Duration) error {
	if err := p.Stop(ctx, grace); err != nil && !errors.Is(err, ErrExited) {
		return err
	}
	for _, ch := range []chan struct{}{p.done, p.drained, p.stdinDone} {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sandbox: stop process %s in sandbox %s: %w", p.id, p.sandbox, ctx.Err())
		}
	}
	p.stdout.close()
	return nil
}

// procStdout is the caller's view of stdout. Once the leader has exited,
// each Read may wait at most WaitDelay for data, so a pipe held open by an
// escaped descendant cannot hang the caller.
type procStdout struct {
	f      *os.File
	p      *localProcess
	eof    atomic.Bool
	closed sync.Once
}

// Read implements io.Reader.
func (s *procStdout) Read(b []byte) (int, error) {
	if s.eof.Load() {
		return 0, io.EOF
	}
	n, err := s.p.readBounded(s.f, b)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, io.EOF):
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.p.log.Warn().Msg("stdout still open after the process exited (a descendant left its process group); closed it")
	case errors.Is(err, os.ErrClosed):
		return n, fmt.Errorf("sandbox: read stdout of process %s in sandbox %s: %w", s.p.id, s.p.sandbox, ErrClosed)
	default:
		return n, fmt.Errorf("sandbox: read stdout of process %s in sandbox %s: %w", s.p.id, s.p.sandbox, err)
	}
	s.eof.Store(true)
	s.close()
	return n, io.EOF
}

func (s *procStdout) close() { s.closed.Do(func() { _ = s.f.Close() }) }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
}

// Write implements io.Writer; it never fails.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		t.truncated = t.truncated || len(p) > t.max || len(t.buf) > 0
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.truncated = true
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept bytes. When older bytes were dropped, a partial
// UTF-8 sequence at the start is trimmed.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if t.truncated {
		for i := 0; i < 3 && len(b) > 0 && b[0]&0xC0 == 0x80; i++ {
			b = b[1:]
		}
	}
	return string(b)
}
