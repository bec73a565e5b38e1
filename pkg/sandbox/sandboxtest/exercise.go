package sandboxtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Features describes what differs between providers, so the suite has no
// per-provider branches.
type Features struct {
	// ChildBinary is the program the sandbox runs: a test binary whose
	// TestMain calls RunChild, at a path valid inside the sandbox. Defaults
	// to the running test binary (os.Executable), right for Local and for a
	// fake remote provider that runs processes on this machine.
	ChildBinary string

	// SignalsReported: the provider reports the signal that killed a process
	// (ExitStatus.Code -1 and Signal "SIGKILL"). When false the suite only
	// requires a non-zero Code for killed processes.
	SignalsReported bool

	// LocalPIDs: processes run on this machine, so the suite can check with
	// kill(pid, 0) that a grandchild did not survive.
	LocalPIDs bool

	// SpawnErrors: Start reports a program that does not exist as a
	// *sandbox.SpawnError (which also matches sandbox.ErrInvalid).
	SpawnErrors bool

	// Interactive: sandboxes implement sandbox.Interactive (a stdin the
	// caller holds open). When false the suite checks that they do not.
	Interactive bool
}

func (f Features) withDefaults() Features {
	if f.ChildBinary == "" {
		f.ChildBinary = executable()
	}
	return f
}

// guard bounds every wait in the suite so a broken provider fails instead of
// hanging. It is not a performance assertion.
const guard = 2 * time.Minute

// Exercise runs the shared sandbox suite against the provider newProvider
// returns (called once per subtest; clean-up belongs in t.Cleanup). Every
// Provider implementation must pass it.
//
// The test binary's TestMain must call RunChild. Exercise must not be called
// from a parallel test: its "Env" subtest sets worker secrets in the process
// environment with t.Setenv to check they never reach a child. Every other
// subtest runs in parallel.
func Exercise(t *testing.T, newProvider func(t *testing.T) sandbox.Provider, f Features) {
	t.Helper()
	s := &suite{newProvider: newProvider, f: f.withDefaults()}

	// Sequential: t.Setenv forbids t.Parallel, and the parallel subtests
	// below only start once this one has restored the environment.
	t.Run("Env", s.testEnv)

	for name, fn := range map[string]func(*testing.T){
		"Echo":                       s.testEcho,
		"StdoutStreamedBeforeExit":   s.testStdoutStreamed,
		"LargeStdoutInOrder":         s.testLargeStdout,
		"ExitCodes":                  s.testExitCodes,
		"StdinDeliveredThenClosed":   s.testStdin,
		"StdinNotReadByChild":        s.testStdinNotRead,
		"NoStdinIsEOF":               s.testNoStdin,
		"StderrDoesNotDeadlock":      s.testStderrNoDeadlock,
		"StderrTailBytes":            s.testStderrTailBytes,
		"StopGraceful":               stopTests{s}.testStopGraceful,
		"StopKillsAfterGrace":        stopTests{s}.testStopKillsAfterGrace,
		"StopWhileStreaming":         stopTests{s}.testStopWhileStreaming,
		"StopAfterExit":              stopTests{s}.testStopAfterExit,
		"GrandchildGoneAfterExit":    stopTests{s}.testGrandchildAfterExit,
		"GrandchildGoneAfterStop":    stopTests{s}.testGrandchildAfterStop,
		"SignalsReported":            stopTests{s}.testSignals,
		"WorkingDirectory":           fileTests{s}.testDir,
		"FileRoundTrip":              fileTests{s}.testFiles,
		"FilesSharedWithProcesses":   fileTests{s}.testFilesShared,
		"PathsOutsideWorkspace":      fileTests{s}.testBadPaths,
		"ReadMissingFile":            fileTests{s}.testReadMissing,
		"InvalidStart":               fileTests{s}.testInvalidStart,
		"SpawnFailure":               fileTests{s}.testSpawnFailure,
		"DestroyIdempotent":          fileTests{s}.testDestroyIdempotent,
		"DestroyStopsProcesses":      fileTests{s}.testDestroyStopsProcesses,
		"SandboxesHaveSeparateHomes": fileTests{s}.testSeparateHomes,
		"InteractiveStdin":           s.testInteractiveStdin,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t)
		})
	}
}

type suite struct {
	newProvider func(t *testing.T) sandbox.Provider
	f           Features
}

var idCounter atomic.Int64

// newID returns a sandbox or process ID unique across runs.
func newID(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%s-%d", prefix, hex.EncodeToString(b), idCounter.Add(1))
}

// ctx returns a context bounded by guard and ended with the test.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), guard)
	t.Cleanup(cancel)
	return c
}

// sandbox creates a sandbox destroyed at the end of the test.
func (s *suite) sandbox(t *testing.T, env map[string]string) sandbox.Sandbox {
	t.Helper()
	p := s.newProvider(t)
	sb, err := p.Create(ctx(t), sandbox.Spec{ID: newID("sbt"), Env: env})
	require.NoError(t, err)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		if err := sb.Destroy(c); err != nil {
			t.Errorf("destroy sandbox %s: %v", sb.ID(), err)
		}
	})
	return sb
}

func (s *suite) argv(steps ...string) []string { return ChildArgvFor(s.f.ChildBinary, steps...) }

// start starts steps in sb.
func (s *suite) start(t *testing.T, sb sandbox.Sandbox, spec sandbox.ProcSpec, steps ...string) sandbox.Process {
	t.Helper()
	if spec.ID == "" {
		spec.ID = newID("p")
	}
	if spec.Argv == nil {
		spec.Argv = s.argv(steps...)
	}
	p, err := sb.Start(ctx(t), spec)
	require.NoError(t, err)
	return p
}

// run runs steps to completion and returns stdout and the exit status.
func (s *suite) run(t *testing.T, sb sandbox.Sandbox, spec sandbox.ProcSpec, steps ...string) (string, sandbox.ExitStatus) {
	t.Helper()
	p := s.start(t, sb, spec, steps...)
	out := readAll(t, p.Stdout())
	return string(out), wait(t, p)
}

// readAll reads r to EOF, failing the test if that takes longer than guard.
func readAll(t *testing.T, r io.Reader) []byte {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- result{b, err}
	}()
	select {
	case res := <-ch:
		require.NoError(t, res.err, "reading stdout")
		return res.b
	case <-time.After(guard):
		t.Fatalf("stdout did not reach EOF within %s", guard)
		return nil
	}
}

// readLine reads one line from br, failing the test if none comes.
func readLine(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	ch := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		line, err := br.ReadString('\n')
		if err != nil {
			errc <- err
			return
		}
		ch <- line
	}()
	select {
	case line := <-ch:
		return line
	case err := <-errc:
		t.Fatalf("reading a stdout line: %v", err)
	case <-time.After(guard):
		t.Fatalf("no stdout line within %s", guard)
	}
	return ""
}

func wait(t *testing.T, p sandbox.Process) sandbox.ExitStatus {
	t.Helper()
	st, err := p.Wait(ctx(t))
	require.NoError(t, err, "Wait")
	return st
}

// requireKilledBy checks that st reports death by signal sig (or at least a
// non-zero code when the provider does not report signals).
func (s *suite) requireKilledBy(t *testing.T, st sandbox.ExitStatus, sig string) {
	t.Helper()
	if s.f.SignalsReported {
		require.Equal(t, -1, st.Code, "Code of a process killed by %s", sig)
		require.Equal(t, sig, st.Signal)
		return
	}
	require.NotZero(t, st.Code, "Code of a process killed by %s", sig)
}

// eventually polls cond with a short tick until it holds or guard passes.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", guard, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ProcessGone reports whether pid no longer runs: it does not exist, or it
// is a zombie waiting for a reaper (a killed orphan under an init that does
// not reap promptly).
func ProcessGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// Format: pid (comm) state ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return false
	}
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}

// requireGrandchildGone reads the grandchild's pid from pidFile and, when
// pids are local, waits until that process is gone.
func (s *suite) requireGrandchildGone(t *testing.T, sb sandbox.Sandbox, pidFile string) {
	t.Helper()
	b, err := sb.ReadFile(ctx(t), pidFile)
	require.NoError(t, err, "the child wrote the grandchild's pid")
	pid, err := strconv.Atoi(string(b))
	require.NoError(t, err)
	require.Positive(t, pid)
	if !s.f.LocalPIDs {
		return
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // only matters if the test failed
	eventually(t, func() bool { return ProcessGone(pid) }, fmt.Sprintf("grandchild pid %d still alive", pid))
}

// lockedBuffer is an io.Writer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

func (s *suite) testEnv(t *testing.T) {
	secrets := map[string]string{
		"FLEET_CF_BRIDGE_TOKEN": "secret-bridge-" + newID("v"),
		"FLEET_NATS_CREDS":      "secret-creds-" + newID("v"),
		"AWS_SECRET_ACCESS_KEY": "secret-aws-" + newID("v"),
		"AWS_ACCESS_KEY_ID":     "secret-awsid-" + newID("v"),
		"CLOUDFLARE_API_TOKEN":  "secret-cf-" + newID("v"),
		"NATS_PASSWORD":         "secret-nats-" + newID("v"),
		"CLAUDECODE":            "1",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	parentHome := os.Getenv("HOME")

	sb := s.sandbox(t, map[string]string{
		"SANDBOXTEST_SPEC":      "from-spec",
		"SANDBOXTEST_BOTH":      "from-spec",
		"FLEET_NATS_CREDS":      secrets["FLEET_NATS_CREDS"],
		"AWS_SECRET_ACCESS_KEY": secrets["AWS_SECRET_ACCESS_KEY"],
	})
	out, st := s.run(t, sb, sandbox.ProcSpec{Env: map[string]string{
		"SANDBOXTEST_PROC":      "from-proc",
		"SANDBOXTEST_BOTH":      "from-proc",
		"FLEET_CF_BRIDGE_TOKEN": secrets["FLEET_CF_BRIDGE_TOKEN"],
		"CLOUDFLARE_API_TOKEN":  secrets["CLOUDFLARE_API_TOKEN"],
		"CLAUDECODE":            "1",
	}}, "env")
	require.Equal(t, 0, st.Code, "stderr: %s", st.StderrTail)

	var env map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &env), "env output: %q", out)
	require.Equal(t, "from-spec", env["SANDBOXTEST_SPEC"], "Spec.Env reaches the child")
	require.Equal(t, "from-proc", env["SANDBOXTEST_PROC"], "ProcSpec.Env reaches the child")
	require.Equal(t, "from-proc", env["SANDBOXTEST_BOTH"], "ProcSpec.Env overrides Spec.Env")
	for name, secret := range secrets {
		require.NotContains(t, env, name, "worker secret %s reached the child", name)
		if len(secret) > 1 {
			for k, v := range env {
				require.NotContains(t, v, secret, "the value of %s reached the child as %s", name, k)
			}
		}
	}
	for _, name := range []string{"HOME", "CLAUDE_CONFIG_DIR"} {
		require.NotEmpty(t, env[name], "%s is set", name)
		require.True(t, strings.HasPrefix(env[name], "/"), "%s=%q is absolute", name, env[name])
		if parentHome != "" {
			require.NotEqual(t, parentHome, env[name], "%s is the sandbox's own, not the worker's HOME", name)
		}
	}
}

func (s *suite) testEcho(t *testing.T) {
	sb := s.sandbox(t, nil)
	out, st := s.run(t, sb, sandbox.ProcSpec{}, "echo hello world", "echo second line")
	require.Equal(t, "hello world\nsecond line\n", out)
	require.Equal(t, sandbox.ExitStatus{Code: 0}, st)
}

func (s *suite) testStdoutStreamed(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "echo first", "sleep 1h")
	br := bufio.NewReader(p.Stdout())
	// The line arrives while the child still sleeps: output is streamed, not
	// buffered until exit.
	require.Equal(t, "first\n", readLine(t, br))
	require.NoError(t, p.Stop(ctx(t), 10*time.Second))
	rest := readAll(t, br)
	require.Empty(t, rest)
	s.requireKilledBy(t, wait(t, p), "SIGTERM")
}

func (s *suite) testLargeStdout(t *testing.T) {
	sb := s.sandbox(t, nil)
	const n, size = 5000, 300
	out, st := s.run(t, sb, sandbox.ProcSpec{}, fmt.Sprintf("lines %d %d", n, size))
	require.Equal(t, 0, st.Code, "stderr: %s", st.StderrTail)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, n)
	for i, l := range lines {
		if l != Line(i, size) {
			t.Fatalf("line %d out of order or corrupt: %.40q", i, l)
		}
	}
}

func (s *suite) testExitCodes(t *testing.T) {
	for _, code := range []int{0, 1, 3, 42, 255} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			sb := s.sandbox(t, nil)
			out, st := s.run(t, sb, sandbox.ProcSpec{}, "echo before", fmt.Sprintf("exit %d", code), "echo never")
			require.Equal(t, "before\n", out)
			require.Equal(t, code, st.Code)
			require.Empty(t, st.Signal)
		})
	}
}

func (s *suite) testStdin(t *testing.T) {
	sb := s.sandbox(t, nil)
	in := "line one\nline two\nno newline at end"
	// stdin-echo only returns at EOF: the process exiting proves stdin was closed.
	out, st := s.run(t, sb, sandbox.ProcSpec{Stdin: []byte(in)}, "stdin-echo", "echo done")
	require.Equal(t, in+"done\n", out)
	require.Equal(t, 0, st.Code)
}

func (s *suite) testStdinNotRead(t *testing.T) {
	sb := s.sandbox(t, nil)
	big := bytes.Repeat([]byte("x"), 1<<20) // more than any pipe buffer
	out, st := s.run(t, sb, sandbox.ProcSpec{Stdin: big}, "echo exiting", "exit 0")
	require.Equal(t, "exiting\n", out)
	require.Equal(t, 0, st.Code)
}

func (s *suite) testNoStdin(t *testing.T) {
	sb := s.sandbox(t, nil)
	out, st := s.run(t, sb, sandbox.ProcSpec{}, "stdin-echo", "echo eof")
	require.Equal(t, "eof\n", out)
	require.Equal(t, 0, st.Code)
}

func (s *suite) testStderrNoDeadlock(t *testing.T) {
	sb := s.sandbox(t, nil)
	const n = 1 << 20
	var copied lockedBuffer
	// 1 MiB of stderr before any stdout: a provider that does not drain
	// stderr while the caller waits on stdout deadlocks here.
	out, st := s.run(t, sb, sandbox.ProcSpec{Stderr: &copied}, fmt.Sprintf("stderr %d", n), "echo after")
	require.Equal(t, "after\n", out)
	require.Equal(t, 0, st.Code)
	want := Pattern(n)
	require.Equal(t, string(want[n-8<<10:]), st.StderrTail, "the default tail is the last 8 KiB")
	require.Equal(t, want, copied.Bytes(), "ProcSpec.Stderr receives all of stderr")
}

func (s *suite) testStderrTailBytes(t *testing.T) {
	sb := s.sandbox(t, nil)
	_, st := s.run(t, sb, sandbox.ProcSpec{StderrTailBytes: 100}, "stderr 5000", "exit 7")
	require.Equal(t, 7, st.Code)
	require.Equal(t, string(Pattern(5000)[4900:]), st.StderrTail)
}

// testInteractiveStdin writes lines one at a time to a process's open stdin
// and reads each answer before writing the next, then closes stdin.
func (s *suite) testInteractiveStdin(t *testing.T) {
	sb := s.sandbox(t, nil)
	isb, ok := sb.(sandbox.Interactive)
	if !s.f.Interactive {
		require.False(t, ok, "the sandbox implements sandbox.Interactive but Features.Interactive is false")
		return
	}
	require.True(t, ok, "Features.Interactive is set but the sandbox does not implement sandbox.Interactive")
	_, err := isb.StartInteractive(ctx(t), sandbox.ProcSpec{ID: newID("p"), Argv: s.argv("echo x"), Stdin: []byte("x")})
	require.ErrorIs(t, err, sandbox.ErrInvalid)

	p, err := isb.StartInteractive(ctx(t), sandbox.ProcSpec{ID: newID("p"), Argv: s.argv("echo ready", "stdin-lines", "echo bye")})
	require.NoError(t, err)
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "ready\n", readLine(t, br))
	for _, line := range []string{"first", "second {\"json\":true}", "third"} {
		_, err := p.Stdin().Write([]byte(line + "\n"))
		require.NoError(t, err)
		// The answer comes while stdin is still open: nothing waits for EOF.
		require.Equal(t, "got "+line+"\n", readLine(t, br))
	}
	require.NoError(t, p.Stdin().Close())
	require.Equal(t, "bye\n", readLine(t, br))
	rest := readAll(t, br)
	require.Empty(t, rest)
	require.Equal(t, 0, wait(t, p).Code)
	_, err = p.Stdin().Write([]byte("late\n"))
	require.ErrorIs(t, err, sandbox.ErrExited)
}
