package sandboxtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/stretchr/testify/require"
)

// fileTests are the subtests of files, working directories, start
// errors and Destroy.
type fileTests struct{ *suite }

func (s fileTests) testDir(t *testing.T) {
	sb := s.sandbox(t, nil)
	require.NoError(t, sb.WriteFile(ctx(t), "sub/dir/marker", []byte("x")))
	root, st := s.run(t, sb, sandbox.ProcSpec{}, "pwd")
	require.Equal(t, 0, st.Code)
	out, st := s.run(t, sb, sandbox.ProcSpec{Dir: "sub/dir"}, "pwd", "print-file marker")
	require.Equal(t, 0, st.Code, "stderr: %s", st.StderrTail)
	require.Equal(t, strings.TrimSuffix(root, "\n")+"/sub/dir\nx", out)

	for _, dir := range []string{"../", "/", "sub/../../x"} {
		_, err := sb.Start(ctx(t), sandbox.ProcSpec{ID: newID("p"), Argv: s.argv("pwd"), Dir: dir})
		require.ErrorIs(t, err, sandbox.ErrInvalid, "Dir %q", dir)
	}
}

func (s fileTests) testFiles(t *testing.T) {
	sb := s.sandbox(t, nil)
	c := ctx(t)
	data := append(bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000), "\nend"...)
	require.NoError(t, sb.WriteFile(c, "a.bin", data))
	got, err := sb.ReadFile(c, "a.bin")
	require.NoError(t, err)
	require.Equal(t, data, got)

	require.NoError(t, sb.WriteFile(c, "nested/dir/b.txt", []byte("first")))
	require.NoError(t, sb.WriteFile(c, "nested/dir/b.txt", []byte("2nd")), "overwrite")
	got, err = sb.ReadFile(c, "nested/./dir/b.txt")
	require.NoError(t, err)
	require.Equal(t, "2nd", string(got))

	require.NoError(t, sb.WriteFile(c, "empty", nil))
	got, err = sb.ReadFile(c, "empty")
	require.NoError(t, err)
	require.Empty(t, got)
}

func (s fileTests) testFilesShared(t *testing.T) {
	sb := s.sandbox(t, nil)
	c := ctx(t)
	require.NoError(t, sb.WriteFile(c, "in/prompt.txt", []byte("from the worker")))
	out, st := s.run(t, sb, sandbox.ProcSpec{}, "print-file in/prompt.txt", "write-file out/result.txt from the child")
	require.Equal(t, 0, st.Code, "stderr: %s", st.StderrTail)
	require.Equal(t, "from the worker", out)
	got, err := sb.ReadFile(c, "out/result.txt")
	require.NoError(t, err)
	require.Equal(t, "from the child", string(got))
}

func (s fileTests) testBadPaths(t *testing.T) {
	sb := s.sandbox(t, nil)
	c := ctx(t)
	for _, p := range []string{"../escape", "..", "a/../../escape", "/etc/passwd", "/tmp/x", ""} {
		require.ErrorIs(t, sb.WriteFile(c, p, []byte("x")), sandbox.ErrInvalid, "WriteFile(%q)", p)
		_, err := sb.ReadFile(c, p)
		require.ErrorIs(t, err, sandbox.ErrInvalid, "ReadFile(%q)", p)
	}
}

func (s fileTests) testReadMissing(t *testing.T) {
	sb := s.sandbox(t, nil)
	_, err := sb.ReadFile(ctx(t), "no-such-file")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
	_, err = sb.ReadFile(ctx(t), "no/such/dir/file")
	require.ErrorIs(t, err, sandbox.ErrNotFound)
}

func (s fileTests) testDestroyIdempotent(t *testing.T) {
	sb := s.sandbox(t, nil)
	c := ctx(t)
	require.NoError(t, sb.WriteFile(c, "f", []byte("x")))
	require.NoError(t, sb.Destroy(c))
	require.NoError(t, sb.Destroy(c), "second Destroy")
	_, err := sb.Start(c, sandbox.ProcSpec{ID: newID("p"), Argv: s.argv("exit 0")})
	require.ErrorIs(t, err, sandbox.ErrClosed)
}

func (s fileTests) testDestroyStopsProcesses(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "fork-grandchild gc.pid", "echo up", "sleep 1h")
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "up\n", readLine(t, br))
	pidBytes, err := sb.ReadFile(ctx(t), "gc.pid")
	require.NoError(t, err)
	require.NoError(t, sb.Destroy(ctx(t)))
	st, err := p.Wait(ctx(t))
	require.NoError(t, err, "Wait after Destroy still reports the status")
	require.False(t, st.Code == 0 && st.Signal == "", "a process killed by Destroy does not exit cleanly: %+v", st)
	if s.f.LocalPIDs {
		pid, err := strconv.Atoi(string(pidBytes))
		require.NoError(t, err)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		eventually(t, func() bool { return ProcessGone(pid) }, fmt.Sprintf("grandchild pid %d survived Destroy", pid))
	}
}

func (s fileTests) testSeparateHomes(t *testing.T) {
	homes := make([]string, 2)
	for i := range homes {
		sb := s.sandbox(t, nil)
		out, st := s.run(t, sb, sandbox.ProcSpec{}, "env")
		require.Equal(t, 0, st.Code)
		var env map[string]string
		require.NoError(t, json.Unmarshal([]byte(out), &env))
		homes[i] = env["HOME"]
		require.NotEmpty(t, homes[i])
	}
	require.NotEqual(t, homes[0], homes[1], "two sandboxes share HOME")
}

func (s fileTests) testInvalidStart(t *testing.T) {
	sb := s.sandbox(t, nil)
	for name, spec := range map[string]sandbox.ProcSpec{
		"empty argv":    {ID: newID("p")},
		"empty program": {ID: newID("p"), Argv: []string{""}},
		"bad ID":        {ID: "a/b", Argv: s.argv("exit 0")},
		"empty ID":      {Argv: s.argv("exit 0")},
	} {
		_, err := sb.Start(ctx(t), spec)
		require.ErrorIs(t, err, sandbox.ErrInvalid, name)
	}
}

func (s fileTests) testSpawnFailure(t *testing.T) {
	if !s.f.SpawnErrors {
		t.Skip("provider reports a missing program only at exit (Features.SpawnErrors false)")
	}
	sb := s.sandbox(t, nil)
	for _, prog := range []string{"/nonexistent/agentfleet-no-such-program", "agentfleet-no-such-program"} {
		_, err := sb.Start(ctx(t), sandbox.ProcSpec{ID: newID("p"), Argv: []string{prog, "-p"}})
		var se *sandbox.SpawnError
		require.ErrorAs(t, err, &se, prog)
		require.Equal(t, prog, se.Program)
		require.ErrorIs(t, err, sandbox.ErrInvalid, prog)
	}
}
