package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// TestCancelAndTimeoutKillWhatTheAgentLeftBehind runs jobs whose agent
// leaves a process as Claude Code's Bash tool can (setsid, double fork,
// SIGTERM ignored) and ends them by cancel and by timeout: the process must
// be gone too.
func TestCancelAndTimeoutKillWhatTheAgentLeftBehind(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	dir := t.TempDir()

	for _, tc := range []struct {
		id     string
		state  protocol.State
		reason string
	}{
		{"escape-cancel", protocol.StateCancelled, protocol.ReasonCancelled},
		{"escape-timeout", protocol.StateFailed, protocol.ReasonTimeout},
	} {
		t.Run(tc.id, func(t *testing.T) {
			t.Parallel()
			pidFile := filepath.Join(dir, tc.id+".pid")
			job := protocol.Job{ID: tc.id, Prompt: "/standin escape=" + pidFile + " sleep=1h"}
			if tc.state == protocol.StateFailed {
				timeout := 2
				job.Options.TimeoutS = &timeout
			}
			b, err := json.Marshal(job)
			require.NoError(t, err)
			f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: tc.id})

			var pid int
			fleettest.Eventually(t, wait, func() bool {
				b, err := os.ReadFile(pidFile)
				if err == nil {
					pid, err = strconv.Atoi(string(b))
				}
				return err == nil
			}, "the agent's escaped grandchild")
			t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) }) // only matters if the test failed
			sid, err := unix.Getsid(pid)
			require.NoError(t, err, "the escaped grandchild runs")
			require.Equal(t, pid, sid, "it leads a session of its own, out of the agent's process group")

			if tc.state == protocol.StateCancelled {
				require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", tc.id), []byte(`{"op":"cancel"}`)))
			}
			r := f.Follow("default", tc.id, wait)
			require.Equal(t, tc.state, r.Final.State)
			res, err := protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).AsResult()
			require.NoError(t, err)
			require.Equal(t, tc.reason, res.XFleet.Reason)
			fleettest.Eventually(t, wait, func() bool { return sandboxtest.ProcessGone(pid) },
				"the escaped grandchild is gone after the "+tc.reason)
		})
	}
}

// A worker killed with SIGKILL cannot kill what its runs left behind (its
// agent dies by Pdeathsig, the escaped grandchild does not); the next
// worker started on the machine does, from the dead worker's cgroup.
func TestNextWorkerKillsWhatAKilledWorkersRunsLeftBehind(t *testing.T) {
	t.Parallel()
	if _, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Containment: sandbox.ContainCgroup}); err != nil {
		t.Skipf("needs a writable cgroup v2 hierarchy (the environ fallback cannot find a dead worker's processes): %v", err)
	}
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second})
	sdir := filepath.Join(f.Dir, "data")
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	a := fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), t.TempDir(), sdir)
	f.SubmitJSON("default", "orphaned", "/standin escape="+pidFile+" sleep=1h")
	a.Expect(t, "started orphaned 1")
	var pid int
	fleettest.Eventually(t, wait, func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			pid, err = strconv.Atoi(string(b))
		}
		return err == nil
	}, "the agent's escaped grandchild")
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) }) // only matters if the test failed
	// The next attempt must not start another one.
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "orphaned"), []byte(`{"op":"cancel"}`)))
	a.Kill(t)
	_, err := unix.Getsid(pid)
	require.NoError(t, err, "the escaped grandchild outlived the killed worker")

	fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), t.TempDir(), sdir)
	fleettest.Eventually(t, wait, func() bool { return sandboxtest.ProcessGone(pid) },
		"the next worker killed the dead worker's leftover")
	require.Equal(t, protocol.StateCancelled, f.Follow("default", "orphaned", wait).Final.State)
}

// A worker that shuts down hands its running job back; what the agent left
// behind ends with the handed-back run, not with the next attempt.
func TestHandBackKillsWhatTheAgentLeftBehind(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 2)
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Grace: 100 * time.Millisecond, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}})
	fleettest.WaitReady(t, a.W)
	pidFile := filepath.Join(t.TempDir(), "gc.pid")
	f.SubmitJSON("default", "handback", "/standin escape="+pidFile+" sleep=1h")
	require.Equal(t, "handback", <-started)
	var pid int
	fleettest.Eventually(t, wait, func() bool {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			pid, err = strconv.Atoi(string(b))
		}
		return err == nil
	}, "the agent's escaped grandchild")
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) }) // only matters if the test failed
	_, err := unix.Getsid(pid)
	require.NoError(t, err, "the escaped grandchild runs")

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, a.W.Stop(ctx), "SIGTERM path: grace, then hand back")
	fleettest.Eventually(t, wait, func() bool { return sandboxtest.ProcessGone(pid) },
		"the escaped grandchild is gone after the hand-back")
	// The job was handed back, not ended: cancel its next attempt so it
	// does not start another.
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "handback"), []byte(`{"op":"cancel"}`)))
	b := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, b.W)
	r := f.Follow("default", "handback", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	require.Equal(t, 2, r.Final.Attempt, "handed back, then ended by the next attempt")
}
