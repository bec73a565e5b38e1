package sandbox_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// hostScratch plants a file in the host's dir (/tmp or /var/tmp) that a
// contained process must not see, and returns its name and a fresh name
// the process writes under the same dir inside (which the host must not
// see afterwards).
func hostScratch(t *testing.T, dir string) (planted, fresh string) {
	t.Helper()
	f, err := os.CreateTemp(dir, "agentfleet-host-*")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	t.Cleanup(func() { _ = os.Remove(f.Name()) })
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	fresh = filepath.Join(dir, "agentfleet-inside-"+hex.EncodeToString(b))
	t.Cleanup(func() { _ = os.Remove(fresh) })
	return f.Name(), fresh
}

// TestContainedScratchDirs: inside a contained sandbox the agent uid
// writes /tmp, /var/tmp and HOME, and runs a script it wrote in /tmp (no
// noexec); the host's /tmp and /var/tmp are not visible inside, and what
// the agent wrote there does not reach them. Before, /tmp was a root-owned
// tmpfs of mode 755 and /var/tmp did not exist: every write failed.
func TestContainedScratchDirs(t *testing.T) {
	requireContained(t)
	plantedTmp, freshTmp := hostScratch(t, "/tmp")
	plantedVar, freshVar := hostScratch(t, "/var/tmp")
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "scratch", nil)
	script := strings.Join([]string{
		"set -e",
		"test ! -e " + plantedTmp + " || { echo host tmp visible; exit 3; }",
		"test ! -e " + plantedVar + " || { echo host var tmp visible; exit 3; }",
		"echo x > /tmp/x",
		"echo y > /var/tmp/y",
		`echo z > "$HOME/z"`,
		"echo inside > " + freshTmp,
		"echo inside > " + freshVar,
		`printf '#!/bin/sh\necho script ran as $(id -u)\n' > /tmp/x.sh`,
		"chmod +x /tmp/x.sh",
		"/tmp/x.sh",
		"cat /tmp/x /var/tmp/y \"$HOME/z\"",
		"stat -c '%a' /tmp /var/tmp",
	}, "\n")
	out, st := run(t, sb, sandbox.ProcSpec{Argv: []string{"/bin/sh", "-c", script}})
	require.Equal(t, 0, st.Code, "stdout: %s\nstderr: %s", out, st.StderrTail)
	require.Equal(t, "script ran as 1000\nx\ny\nz\n1777\n1777\n", out)
	require.NoFileExists(t, freshTmp, "the agent's /tmp is its own")
	require.NoFileExists(t, freshVar, "the agent's /var/tmp is its own")
	home := filepath.Dir(sb.(sandbox.HostConfigDir).HostConfigDir())
	got, err := os.ReadFile(filepath.Join(home, "z"))
	require.NoError(t, err, "HOME is the sandbox's own home/")
	require.Equal(t, "z\n", string(got))
	// A second process of the same sandbox starts with a fresh /tmp (where
	// only the way to the sandbox's own directories is, when they live
	// under the host's /tmp) and an empty /var/tmp.
	out, st = run(t, sb, sandbox.ProcSpec{Argv: []string{"/bin/sh", "-c", "ls -A /var/tmp; ls /tmp/x /tmp/x.sh"}})
	require.NotEqual(t, 0, st.Code)
	require.Empty(t, out)
}

// TestContainedScratchIsBounded: /tmp holds at most LocalConfig.TmpBytes.
func TestContainedScratchIsBounded(t *testing.T) {
	requireContained(t)
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained, TmpBytes: 1 << 20})
	sb := b.create(t, "bounded", nil)
	out, st := run(t, sb, sandbox.ProcSpec{Argv: []string{"/bin/sh", "-c",
		"head -c 2000000 /dev/zero > /tmp/big && echo fitted || echo full; head -c 2000000 /dev/zero > /var/tmp/big && echo fitted || echo full"}})
	require.Equal(t, 0, st.Code, st.StderrTail)
	require.Equal(t, "full\nfull\n", out)
}

// TestContainedClaudeRunsAScriptFromTmp: the real CLI, contained, has its
// Bash tool write /tmp/x.sh and run it; the script's output comes back in
// the tool result the CLI sends the model.
func TestContainedClaudeRunsAScriptFromTmp(t *testing.T) {
	const cmd = `printf '#!/bin/sh\necho tmp script ran as $(id -u)\n' > /tmp/x.sh && chmod +x /tmp/x.sh && /tmp/x.sh`
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if res := r.ToolResults(); len(res) > 0 {
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("tool said " + res[len(res)-1])}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.ToolUse("Bash", map[string]any{"command": cmd})}}
	})
	sb, spec := claudeContained(t, fake)
	spec.Argv = append(spec.Argv, "-p", "--output-format", "stream-json", "--verbose", "--allowedTools", "Bash", "--", "run the script")
	p, err := sb.Start(testCtx(t), spec)
	require.NoError(t, err)
	lines := readLines(t, p.Stdout(), func(map[string]any) bool { return false })
	st, err := p.Wait(testCtx(t))
	require.NoError(t, err)
	require.Equal(t, 0, st.Code, st.StderrTail)
	conv := fake.Conversation()
	require.Len(t, conv, 2, "a tool call, then the answer")
	res := conv[1].ToolResults()
	require.NotEmpty(t, res)
	require.Contains(t, res[len(res)-1], "tmp script ran as 1000", "the script's output is the tool result")
	require.Contains(t, lines[len(lines)-1]["result"], "tmp script ran as 1000")
}
