package fleettest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// DispatcherFlag makes the test binary a dispatcher process, so a test can
// SIGKILL the admitting dispatcher: argv is [exe, DispatcherFlag, natsURL,
// storageDir, maxConcurrency, leaseTTL]. It prints "ready" once serving and
// "admitting" once it holds the admitter lease.
const DispatcherFlag = "--e2e-dispatcher"

func dispatcherProcess(args []string) int {
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: --e2e-dispatcher natsURL storageDir maxConcurrency leaseTTL")
		return 2
	}
	maxConc, err := strconv.Atoi(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ttl, err := time.ParseDuration(args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	nc, err := nats.Connect(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store, err := storage.NewFS(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d, err := dispatcher.New(dispatcher.Config{
		NC: nc, Status: store, Objects: store,
		Provision: provision.Config{Names: protocol.NewNames(""), MaxConcurrency: maxConc},
		Admission: admission.Config{LeaseTTL: ttl},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = d.Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	for !d.Admitting() {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("admitting")
	select {} // until killed
}

// DispatcherProc is a dispatcher running as a child process.
type DispatcherProc struct {
	cmd   *exec.Cmd
	lines chan string
}

// StartDispatcherProcess starts a dispatcher as a child process and waits
// until it serves.
func StartDispatcherProcess(t *testing.T, url, sdir string, maxConcurrency int, leaseTTL time.Duration) *DispatcherProc {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, DispatcherFlag, url, sdir, strconv.Itoa(maxConcurrency), leaseTTL.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &DispatcherProc{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	p.Expect(t, "ready")
	return p
}

// Expect waits for a line of the dispatcher process starting with prefix.
func (p *DispatcherProc) Expect(t *testing.T, prefix string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			require.True(t, ok, "dispatcher process exited while waiting for %q", prefix)
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %q from the dispatcher process", prefix)
		}
	}
}

// Kill SIGKILLs the dispatcher process.
func (p *DispatcherProc) Kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
}
