package sandboxtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	if !sandboxtest.RunChild() {
		goleak.VerifyTestMain(m)
	}
}

// runChild runs the test binary in child mode directly (no sandbox).
func runChild(t *testing.T, stdin string, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = t.TempDir()
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return o.String(), e.String(), ee.ExitCode()
	}
	require.NoError(t, err)
	return o.String(), e.String(), 0
}

func TestRunChildSteps(t *testing.T) {
	t.Parallel()
	out, errOut, code := runChild(t, "in\n", sandboxtest.ChildArgv(
		"echo a b", "stdin-echo", "stderr 5", "lines 2 10", "write-file d/f.txt hi there", "print-file d/f.txt", "exit 4", "echo never")...)
	require.Equal(t, 4, code)
	require.Equal(t, "a b\nin\n"+sandboxtest.Line(0, 10)+"\n"+sandboxtest.Line(1, 10)+"\nhi there", out)
	require.Equal(t, "abcde", errOut)
}

func TestRunChildArgsAfterScript(t *testing.T) {
	t.Parallel()
	argv := append(sandboxtest.ChildArgv("echo start", "args"), "-p", "--output-format", "stream-json", "--", "exit 9")
	out, _, code := runChild(t, "", argv...)
	require.Equal(t, 0, code, "\"exit 9\" after the first flag is an argument, not a step")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Equal(t, "start", lines[0])
	var args []string
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &args))
	require.Equal(t, []string{"-p", "--output-format", "stream-json", "--", "exit 9"}, args)
}

func TestRunChildBadStep(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"frobnicate", "exit x", "sleep forever", "kill-self SIGNOPE", "lines 1"} {
		_, errOut, code := runChild(t, "", sandboxtest.ChildArgv(step)...)
		require.Equal(t, 125, code, step)
		require.Contains(t, errOut, "sandboxtest child", step)
	}
}

func TestRunChildNotAChild(t *testing.T) {
	t.Parallel()
	// This process was started by go test, without ChildFlag.
	require.NotEqual(t, sandboxtest.ChildFlag, os.Args[min(1, len(os.Args)-1)])
	require.False(t, sandboxtest.RunChild())
}

func TestPatternAndLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", string(sandboxtest.Pattern(3)))
	require.Len(t, sandboxtest.Pattern(1000), 1000)
	require.Equal(t, "00000012xx", sandboxtest.Line(12, 10))
	require.Equal(t, "0000", sandboxtest.Line(12, 4))
}
