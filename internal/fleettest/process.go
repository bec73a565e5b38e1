package fleettest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// WorkerFlag makes the test binary a worker process, so a test can SIGKILL
// a real worker: argv is [exe, WorkerFlag, natsURL, journalDir, storageDir, sandboxDir].
// It prints "ready" once pulling and "started <id> <attempt>" when a run starts.
const WorkerFlag = "--e2e-worker"

func workerProcess(args []string) int {
	if len(args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: --e2e-worker natsURL journalDir storageDir sandboxDir")
		return 2
	}
	url, jdir, sdir, sbdir := args[0], args[1], args[2], args[3]
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	store, err := storage.NewFS(sdir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	merge := transcript.NewReader(nc, protocol.NewNames(""), store).MergeIfArchived
	jl, err := journal.New(journal.Config{Dir: jdir, Store: store, SpillAfter: worker.DefaultJournalSpillAfter,
		AssembleFunc: merge, NonFinalFunc: merge})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := jl.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// A test may give the agent command and the sandbox's fixed env (JSON).
	var sbEnv map[string]string
	if v := os.Getenv(envSandboxEnv); v != "" {
		_ = json.Unmarshal([]byte(v), &sbEnv)
	}
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: sbdir, Env: sbEnv, Isolation: sandbox.IsolationNone})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	exe, _ := os.Executable()
	command := []string{exe, StandinFlag}
	if v := os.Getenv(envAgent); v != "" {
		_ = json.Unmarshal([]byte(v), &command)
	}
	runner, err := agent.New(agent.Config{Command: command})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := make(chan string, 16)
	w, err := worker.New(worker.Config{
		NC: nc, Slots: 1, Providers: map[string]sandbox.Provider{"local": local}, Runner: runner, Journal: jl,
		ConsumerRetry: 50 * time.Millisecond,
		Sessions:      session.Config{Command: command},
		Checkpoints:   store,
		Test: worker.TestConfig{RunStarted: func(tenant, id string, attempt int) {
			out <- fmt.Sprintf("started %s %d", id, attempt)
		}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := w.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for !w.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready")
	for line := range out {
		fmt.Println(line)
	}
	return 0
}

// WorkerProc is a worker running as a child process.
type WorkerProc struct{ *ChildProc }

// Environment of a worker process: its agent command and its sandbox's
// fixed environment, as JSON.
const (
	envAgent      = "FLEET_E2E_AGENT"
	envSandboxEnv = "FLEET_E2E_SANDBOX_ENV"
)

// StartWorkerProcess starts a worker as a child process (so a test can
// SIGKILL it) and waits until it pulls.
func StartWorkerProcess(t *testing.T, url, jdir, sdir string) *WorkerProc {
	t.Helper()
	return StartWorkerProcessWith(t, url, jdir, sdir, nil, nil)
}

// StartWorkerProcessWith is StartWorkerProcess with an agent command (nil:
// the stand-in) and a fixed environment for its sandboxes.
func StartWorkerProcessWith(t *testing.T, url, jdir, sdir string, agentCmd []string, sandboxEnv map[string]string) *WorkerProc {
	t.Helper()
	var env []string
	if agentCmd != nil {
		b, _ := json.Marshal(agentCmd)
		env = append(env, envAgent+"="+string(b))
	}
	if sandboxEnv != nil {
		b, _ := json.Marshal(sandboxEnv)
		env = append(env, envSandboxEnv+"="+string(b))
	}
	p := &WorkerProc{startChild(t, "worker", env, WorkerFlag, url, jdir, sdir, t.TempDir())}
	p.Expect(t, "ready")
	return p
}

// ChildProc is this test binary running as a child process in one of its
// modes (worker, dispatcher), printing what it does on stdout.
type ChildProc struct {
	what  string
	cmd   *exec.Cmd
	lines chan string
}

// startChild starts the test binary with args and env added to this
// process's environment; t's cleanup kills it.
func startChild(t *testing.T, what string, env []string, args ...string) *ChildProc {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &ChildProc{what: what, cmd: cmd, lines: make(chan string, 64)}
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
	return p
}

// Expect waits for a line of the process starting with prefix.
func (p *ChildProc) Expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			require.True(t, ok, "%s process exited while waiting for %q", p.what, prefix)
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %q from the %s process", prefix, p.what)
		}
	}
}

// Kill SIGKILLs the process.
func (p *ChildProc) Kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
}
