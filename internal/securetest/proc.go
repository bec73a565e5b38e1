package securetest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Wait bounds every wait of the harness on a process or a service.
const Wait = 2 * time.Minute

// Proc is a binary running as a child process, its output kept.
type Proc struct {
	Cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer // stdout
	err  bytes.Buffer // stderr
	done chan struct{}
	code int
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Start runs bin with args and env added to this process's environment.
// Cleanup stops it (SIGTERM, then SIGKILL after 20s) and, when the test
// failed, logs its stderr's tail.
func Start(t testing.TB, env []string, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = lockedWriter{&p.mu, &p.out}, lockedWriter{&p.mu, &p.err}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	go func() {
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(20 * time.Second)
		if t.Failed() {
			s := p.Stderr()
			if len(s) > 6000 {
				s = s[len(s)-6000:]
			}
			t.Logf("%s %v stderr (tail):\n%s", filepath.Base(bin), args, s)
		}
	})
	return p
}

// Stop sends SIGTERM and waits up to grace, then kills.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Wait waits for the process to exit and returns its code, stdout, stderr.
func (p *Proc) Wait(t testing.TB) (int, string, string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(Wait):
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v did not exit; stderr:\n%s", p.Cmd.Args, p.Stderr())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code, p.out.String(), p.err.String()
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stderr is what the process wrote to stderr so far.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err.String()
}
