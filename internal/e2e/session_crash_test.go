package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// answers returns the stand-in's assistant texts of a run, in order.
func answers(r fleettest.Run) []string {
	var out []string
	for _, l := range r.Lines {
		if s := string(l.Data); strings.Contains(s, `"type":"assistant"`) {
			i := strings.Index(s, "[stand-in agent] You said: ")
			out = append(out, s[i:strings.Index(s[i:], `"}`)+i])
		}
	}
	return out
}

// TestStandinSessionResumesAfterACrash: the agent exits mid-turn (after it
// recorded the turn's input in its transcript); the worker restores the
// last checkpoint in place of that transcript, resumes the session in a new
// process and runs the input again: it is applied once (the agent's
// history has it once), nothing is lost, the crashed turn keeps its
// synthetic result, a running status says what happened, and the session
// goes on to one succeeded status.
func TestStandinSessionResumesAfterACrash(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "crash-1")
	idleS := 600
	submitSession(t, f, "default", "crash-1", "first", &protocol.Session{IdleTimeoutS: &idleS}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "crash-1", input("/standin crashonce=crash-marker"))
	sendCtl(t, f, "default", "crash-1", input("after the crash"))
	resumed := sw.waitFor("running after the crash", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateRunning && ev.Error != nil
	})
	require.Equal(t, protocol.CodeProcessExit, resumed.Error.Code)
	require.Contains(t, resumed.Error.Message, "the agent crashed during the turn of input")
	require.Contains(t, resumed.Error.Message, "exited with code 1")
	require.Contains(t, resumed.Error.Message, "resume 1 of 3")
	sw.state(protocol.StateIdle, 4)
	sendCtl(t, f, "default", "crash-1", protocol.CtlOp{Op: protocol.OpEnd})

	r := f.Follow("default", "crash-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 4, r.Final.Turn)
	res := results(r)
	require.Len(t, res, 4, "every turn has a result, the crashed one its synthetic one")
	require.Equal(t, true, res[1]["is_error"])
	require.Equal(t, "process_exit", res[1]["x_fleet"].(map[string]any)["reason"])
	// The agent's history as it answered: the crashed input once, before
	// the next one.
	require.Equal(t, []string{
		`[stand-in agent] You said: first (0 earlier messages in this session)`,
		`[stand-in agent] You said: /standin crashonce=crash-marker (1 earlier messages in this session)`,
		`[stand-in agent] You said: after the crash (2 earlier messages in this session)`,
	}, answers(r))
	sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, 1, terminalCount(sw.all()))
}

// TestStandinSessionCrashingInputNotAppliedThrice: an input that crashes
// the agent again after the resume is not applied a third time: the
// session fails, and its status names the input and why.
func TestStandinSessionCrashingInputNotAppliedThrice(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "crash-2")
	submitSession(t, f, "default", "crash-2", "first", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, f, "default", "crash-2", input("/standin crash=1"))
	r := f.Follow("default", "crash-2", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeProcessExit, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "the agent crashed during the turn of input")
	require.Contains(t, r.Final.Error.Message, "it crashed on this input before, so it is not applied again")
	require.Equal(t, 3, r.Final.Turn)
	require.Len(t, results(r), 3)
	sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, 1, terminalCount(sw.all()))
}

// TestStandinSessionCrashResumesAreBounded: after maxCrashResumes (3)
// resumes in one attempt, the next crash fails the session with the reason.
func TestStandinSessionCrashResumesAreBounded(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "crash-3")
	t.Cleanup(func() {
		if t.Failed() {
			for _, ev := range sw.all() {
				t.Logf("status %s turn %d err %+v", ev.State, ev.Turn, ev.Error)
			}
		}
	})
	submitSession(t, f, "default", "crash-3", "first", &protocol.Session{}, protocol.Options{})
	for _, m := range []string{"a", "b", "c", "d"} {
		sendCtl(t, f, "default", "crash-3", input("/standin crashonce=marker-"+m))
	}
	r := f.Follow("default", "crash-3", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Contains(t, r.Final.Error.Message, "gave up after 3 resumes")
	// first, then a, b, c each crashed and ran again, then d crashed.
	require.Len(t, answers(r), 4)
	require.Len(t, results(r), 8)
}

// TestStandinSessionCheckpointOverLimit: session files over the worker's
// limit are not stored; the idle status says so (code, size, limit), the
// session goes on and is not parked when its idle timeout passes (the
// status is repeated instead), and a crash then cannot resume it exactly,
// so it fails with that reason instead of resuming from an older state.
func TestStandinSessionCheckpointOverLimit(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Sessions.MaxFilesBytes = 10
		c.Test.SessionIdle = 20 * time.Millisecond
	}}).W)
	sw := watchStatus(t, f, "default", "big-1")
	submitSession(t, f, "default", "big-1", "first", &protocol.Session{}, protocol.Options{})
	idle := sw.state(protocol.StateIdle, 1)
	require.NotNil(t, idle.Error, "the idle status says the checkpoint failed")
	require.Equal(t, protocol.CodeCheckpointFailed, idle.Error.Code)
	require.Contains(t, idle.Error.Message, "over the limit of 10")
	sw.waitFor("a second idle status", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateIdle && ev.At.After(idle.At) && ev.Error != nil
	})
	for _, ev := range sw.all() {
		require.NotEqual(t, protocol.StateParked, ev.State)
	}
	sendCtl(t, f, "default", "big-1", input("/standin crash=1"))
	r := f.Follow("default", "big-1", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Contains(t, r.Final.Error.Message, "the last turn's checkpoint could not be stored")
}
