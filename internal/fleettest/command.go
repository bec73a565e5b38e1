package fleettest

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// MainEnv, set to "1" in a child's environment, makes a command's test
// binary run the command's main() instead of the tests (see RunMain), so a
// test can run the command as a real process: its exit code, streams and
// signals.
const MainEnv = "FLEET_TEST_RUN_MAIN"

// RunMain is the TestMain of a command package whose tests start the
// command as a process: in a child started by StartCommand it runs main;
// otherwise it is Main.
func RunMain(m *testing.M, main func()) {
	if os.Getenv(MainEnv) == "1" {
		main()
		os.Exit(0)
	}
	Main(m)
}

// CommandWait bounds every wait on a command process.
const CommandWait = 2 * time.Minute

// Command is the test's command running as a child process.
type Command struct {
	Cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	lines  chan string // stderr, line by line
	done   chan struct{}
	code   int
}

// StartCommand runs this test binary as its command (see RunMain) with
// args, stdin empty, NO_COLOR unset.
func StartCommand(t testing.TB, args ...string) *Command {
	t.Helper()
	return StartCommandEnv(t, nil, args...)
}

// StartCommandEnv is StartCommand with env (NAME=value) added to the
// command's environment.
func StartCommandEnv(t testing.TB, env []string, args ...string) *Command {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(append(os.Environ(), MainEnv+"=1", "NO_COLOR="), env...)
	cmd.Stdin = strings.NewReader("")
	p := &Command{Cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	outPipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var wg sync.WaitGroup
	wg.Go(func() {
		b, _ := io.ReadAll(outPipe)
		p.mu.Lock()
		p.stdout.Write(b)
		p.mu.Unlock()
	})
	wg.Go(func() {
		defer close(p.lines)
		r := bufio.NewReader(errPipe)
		for {
			l, err := r.ReadString('\n')
			p.mu.Lock()
			p.stderr.WriteString(l)
			p.mu.Unlock()
			if l != "" {
				select {
				case p.lines <- strings.TrimRight(l, "\n"):
				default: // nobody is reading: the buffer keeps it
				}
			}
			if err != nil {
				return
			}
		}
	})
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Wait waits for the process to exit and returns its code, stdout, stderr.
func (p *Command) Wait(t testing.TB) (int, string, string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(CommandWait):
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v did not exit; stderr:\n%s", p.Cmd.Args[1:], p.Stderr())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code, p.stdout.String(), p.stderr.String()
}

// Stderr is what the process wrote to stderr so far.
func (p *Command) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Expect waits for a stderr line containing s and returns it.
func (p *Command) Expect(t testing.TB, s string) string {
	t.Helper()
	timeout := time.After(CommandWait)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%v exited before saying %q; stderr:\n%s", p.Cmd.Args[1:], s, p.Stderr())
			}
			if strings.Contains(l, s) {
				return l
			}
		case <-timeout:
			t.Fatalf("%v never said %q; stderr:\n%s", p.Cmd.Args[1:], s, p.Stderr())
		}
	}
}

// Signal sends sig to the process.
func (p *Command) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.Cmd.Process.Signal(sig))
}
