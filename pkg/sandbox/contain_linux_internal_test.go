package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each run's group is removed when the run ends, whether killAll found it
// empty (removed at once, release does not try again) or had processes to
// kill, and the base goes with the last run, not before.
func TestCgroupRunsLeaveNothingBehind(t *testing.T) {
	shared, err := cgroupBase()
	if err != nil {
		t.Skipf("this machine offers no writable cgroup v2 hierarchy: %v", err)
	}
	c := &cgroupContainment{base: filepath.Join(filepath.Dir(shared.base), "agentfleet-test-"+strconv.Itoa(os.Getpid())), kill: shared.kill}
	t.Cleanup(func() { _ = removeCgroupTree(c.base) })
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	empty, err := c.newRun("sb", "empty")
	require.NoError(t, err)
	busy, err := c.newRun("sb", "busy")
	require.NoError(t, err)
	re, rb := empty.(*cgroupRun), busy.(*cgroupRun)
	require.True(t, exists(re.dir) && exists(rb.dir))

	// A process in the busy group (moved there after its start).
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rb.useFD = false
	require.NoError(t, rb.started(cmd.Process.Pid))

	n, err := re.killAll()
	require.NoError(t, err)
	require.Zero(t, n)
	require.False(t, exists(re.dir), "an empty group goes in killAll")
	re.release()
	re.release() // twice: counted once
	require.True(t, exists(c.base), "another run still has its group in base")

	n, err = rb.killAll()
	require.NoError(t, err)
	require.Equal(t, 1, n, "the sleeping process was killed")
	rb.release()
	require.False(t, exists(rb.dir), "a group that held processes goes in release")
	require.False(t, exists(c.base), "the last run's release removes base")

	// A run made after base went makes it again.
	again, err := c.newRun("sb", "again")
	require.NoError(t, err)
	require.True(t, exists(again.(*cgroupRun).dir))
	again.release()
	require.False(t, exists(c.base))
}
