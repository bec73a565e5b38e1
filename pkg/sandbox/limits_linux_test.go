package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestApplyLimitsWritesTheGroup checks what is written into a run's
// cgroup: asked limits over defaults, "max" (or cpu.weight's 100) for none,
// and nothing created where a controller's file is missing. (This
// development host's cgroup v2 tree offers no controllers, so the kernel's
// enforcement itself is not tested here.)
func TestApplyLimitsWritesTheGroup(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"memory.max", "pids.max", "cpu.weight"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), nil, 0o644))
	}
	nop := zerolog.Nop()
	cfg := LocalConfig{Logger: &nop, DefaultLimits: Limits{Pids: 256, CPUWeight: 50}, MaxLimits: Limits{MemoryBytes: 1 << 30}}
	run := &cgroupRun{dir: dir}
	require.NoError(t, applyLimits(run, cfg, Limits{MemoryBytes: 512 << 20}, true))
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		return string(b)
	}
	require.Equal(t, "536870912", read("memory.max"))
	require.Equal(t, "256", read("pids.max"))
	require.Equal(t, "50", read("cpu.weight"))

	require.NoError(t, applyLimits(run, LocalConfig{Logger: &nop}, Limits{}, true))
	require.Equal(t, "max", read("memory.max"), "a reused group loses the last run's limits")
	require.Equal(t, "max", read("pids.max"))
	require.Equal(t, "100", read("cpu.weight"))

	require.ErrorIs(t, applyLimits(run, cfg, Limits{MemoryBytes: 2 << 30}, true), ErrInvalid)

	bare := &cgroupRun{dir: t.TempDir()}
	require.NoError(t, applyLimits(bare, cfg, Limits{Pids: 10}, true), "missing controllers are logged, not fatal")
	_, err := os.Stat(filepath.Join(bare.dir, "pids.max"))
	require.ErrorIs(t, err, os.ErrNotExist, "interface files are never created")
}

func TestProgramBind(t *testing.T) {
	root, work := "/var/lib/fleet/sandboxes", "/var/lib/fleet/sandboxes/j1/work"
	for path, want := range map[string]string{
		"/usr/local/bin/claude":             "",
		work + "/node_modules/.bin/tool":    "",
		"/opt/claude/bin/claude":            "/opt/claude/bin",
		"/root/.local/share/claude/v/2.1.3": "/root/.local/share/claude/v",
		"/tmp/probe.sh":                     "/tmp/probe.sh",
		"/root/agent":                       "/root/agent",
		"/var/lib/fleet/agent":              "/var/lib/fleet/agent",
		"/opt/agent":                        "/opt/agent",
	} {
		require.Equal(t, want, programBind(path, []string{root}, work), path)
	}
	// A directory holding the worker's credentials or data is never bound.
	hidden := []string{root, "/srv/fleet/worker.creds"}
	require.Equal(t, "/srv/fleet/claude", programBind("/srv/fleet/claude", hidden, work))
	require.Equal(t, "/srv/other", programBind("/srv/other/claude", hidden, work))
}
