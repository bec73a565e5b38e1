package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testContainment is a cgroup containment of its own beside the process's
// shared one, removed (with anything left in it) when the test ends.
func testContainment(t *testing.T, name string) *cgroupContainment {
	shared, err := cgroupBase()
	if err != nil {
		t.Skipf("this machine offers no writable cgroup v2 hierarchy: %v", err)
	}
	c := &cgroupContainment{base: filepath.Join(filepath.Dir(shared.base), name+"-"+strconv.Itoa(os.Getpid())), kill: shared.kill}
	t.Cleanup(func() { _ = removeCgroupTree(c.base) })
	return c
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// startIn starts `sleep 60` the way Local does: prepare, then started.
func startIn(t *testing.T, r *cgroupRun) *exec.Cmd {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	r.prepare(cmd)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.NoError(t, r.started(cmd.Process.Pid))
	return cmd
}

// A run whose group ends empty hands the group to the next run, which
// starts its process in it; a group that held processes to kill, or may
// hold one, is never handed on; the last run leaves the kept groups and
// base to trim, which a live run holds off.
func TestCgroupGroupsReused(t *testing.T) {
	c := testContainment(t, "agentfleet-test-reuse")

	first, err := c.newRun("sb", "first")
	require.NoError(t, err)
	r1 := first.(*cgroupRun)
	require.True(t, exists(r1.dir))
	n, err := r1.killAll()
	require.NoError(t, err)
	require.Zero(t, n)
	r1.release()
	r1.release() // twice: counted once
	require.True(t, exists(r1.dir), "an empty group is kept for the next run")

	second, err := c.newRun("sb", "second")
	require.NoError(t, err)
	r2 := second.(*cgroupRun)
	require.Equal(t, r1.dir, r2.dir, "the next run reuses the kept group")
	third, err := c.newRun("sb", "third")
	require.NoError(t, err)
	r3 := third.(*cgroupRun)
	require.NotEqual(t, r2.dir, r3.dir, "no kept group left: a new one")

	// The reused group's process starts in it (its kept descriptor, or a
	// move after start where clone3 cannot), and is killed with the run.
	cmd := startIn(t, r2)
	pids, err := cgroupPIDs(r2.dir)
	require.NoError(t, err)
	require.Equal(t, []int{cmd.Process.Pid}, pids, "the process runs in the reused group")
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP)) // still there when killAll looks
	n, err = r2.killAll()
	require.NoError(t, err)
	require.Equal(t, 1, n, "the process in the reused group was killed")
	_ = cmd.Wait()
	r2.release()
	require.False(t, exists(r2.dir), "a group that needed a kill is removed, not handed on")

	// A run released without killAll (a failed start) may hold a process:
	// its group is removed, never handed on.
	r3.release()
	require.False(t, exists(r3.dir), "a group not known empty is removed")

	// A run that ends clean keeps its group in the pool after the last run,
	// for trim, which leaves nothing behind, though not while a run is live.
	clean, err := c.newRun("sb", "clean")
	require.NoError(t, err)
	_, err = clean.killAll()
	require.NoError(t, err)
	clean.release()
	c.mu.Lock()
	kept := len(c.idle)
	c.mu.Unlock()
	require.Equal(t, 1, kept)
	held, err := c.newRun("sb", "held")
	require.NoError(t, err)
	c.trim()
	require.True(t, exists(held.(*cgroupRun).dir), "trim leaves base and groups alone while a run is live")
	require.True(t, exists(c.base))
	_, err = held.killAll()
	require.NoError(t, err)
	held.release()
	c.trim()
	require.False(t, exists(held.(*cgroupRun).dir), "trim removes the kept groups")
	require.False(t, exists(c.base), "and base")

	// A run made after base went makes it again.
	again, err := c.newRun("sb", "again")
	require.NoError(t, err)
	require.True(t, exists(again.(*cgroupRun).dir))
	_, err = again.killAll()
	require.NoError(t, err)
	again.release()
	c.trim()
	require.False(t, exists(c.base))
}

// Once no run is left for idleFor, the timer trims the kept groups and
// base on its own.
func TestCgroupGroupsTrimmedWhenIdle(t *testing.T) {
	c := testContainment(t, "agentfleet-test-idle")
	c.idleFor = 20 * time.Millisecond
	var runs []containedRun
	for range 3 {
		r, err := c.newRun("sb", "p")
		require.NoError(t, err)
		runs = append(runs, r)
	}
	for _, r := range runs {
		_, err := r.killAll()
		require.NoError(t, err)
		r.release()
	}
	c.mu.Lock()
	require.Len(t, c.idle, 3, "the three empty groups are kept")
	c.mu.Unlock()
	// The trim runs on its timer's goroutine: poll for its work.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); exists(c.base) && time.Now().Before(deadline); {
		<-tick.C
	}
	require.False(t, exists(c.base), "idle groups and base trimmed after idleFor")
	for _, r := range runs {
		require.False(t, exists(r.(*cgroupRun).dir))
	}
}

// A group whose processes had to be killed is never handed on: on some
// kernels (6.18 here) a process later started in it with CLONE_INTO_CGROUP
// is killed at birth. Runs that end clean and runs that leave a process
// behind alternate; every run's process must be alive in its group.
func TestCgroupKilledGroupNotReused(t *testing.T) {
	c := testContainment(t, "agentfleet-test-killed")
	killed := map[string]bool{}
	for i := range 10 {
		r, err := c.newRun("sb", "p")
		require.NoError(t, err)
		cr := r.(*cgroupRun)
		require.False(t, killed[cr.dir], "run %d got a group that needed a kill", i)
		cmd := startIn(t, cr)
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP), "run %d: process alive", i)
		pids, err := cgroupPIDs(cr.dir)
		require.NoError(t, err)
		require.Equal(t, []int{cmd.Process.Pid}, pids, "run %d: process alive in its group", i)
		if i%2 == 0 {
			// The run leaves its process behind: killAll kills it.
			n, err := cr.killAll()
			require.NoError(t, err)
			require.Equal(t, 1, n)
			killed[cr.dir] = true
			_ = cmd.Wait()
		} else {
			// The run ends clean: its process is gone before killAll.
			require.NoError(t, cmd.Process.Kill())
			_ = cmd.Wait()
			n, err := cr.killAll()
			require.NoError(t, err)
			require.Zero(t, n)
		}
		r.release()
	}
}

// BenchmarkCgroupRun is one contained run of /bin/true as Local does it
// (group, start in the group, wait, killAll, release), with groups kept
// for reuse and, as the baseline in the same run, a group made and removed
// per run. cpu_us/op is the benchmark process's CPU (the cgroup work is
// the kernel's, on the caller's system calls), not the child's.
func BenchmarkCgroupRun(b *testing.B) {
	shared, err := cgroupBase()
	if err != nil {
		b.Skipf("this machine offers no writable cgroup v2 hierarchy: %v", err)
	}
	truePath, err := exec.LookPath("true")
	require.NoError(b, err)
	for _, arm := range []struct {
		name    string
		maxIdle int
	}{{"pooled", 0}, {"fresh_baseline", -1}} {
		b.Run(arm.name, func(b *testing.B) {
			c := &cgroupContainment{base: filepath.Join(filepath.Dir(shared.base), "agentfleet-bench-"+strconv.Itoa(os.Getpid())), kill: shared.kill, maxIdle: arm.maxIdle}
			defer func() { c.trim(); _ = removeCgroupTree(c.base) }()
			var ru0, ru1 syscall.Rusage
			require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru0))
			for b.Loop() {
				r, err := c.newRun("sb", "p")
				require.NoError(b, err)
				cmd := exec.Command(truePath)
				cmd.SysProcAttr = &syscall.SysProcAttr{}
				r.prepare(cmd)
				require.NoError(b, cmd.Start())
				require.NoError(b, r.started(cmd.Process.Pid))
				require.NoError(b, cmd.Wait())
				_, err = r.killAll()
				require.NoError(b, err)
				r.release()
			}
			require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru1))
			cpu := time.Duration(ru1.Utime.Nano() - ru0.Utime.Nano() + ru1.Stime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu_us/op")
		})
	}
}
