package sandboxtest

import (
	"bufio"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/stretchr/testify/require"
)

// stopTests are the subtests of Stop, signals and what a process leaves
// behind.
type stopTests struct{ *suite }

func (s stopTests) testStopGraceful(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "echo ready", "sleep 1h")
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "ready\n", readLine(t, br))
	require.NoError(t, p.Stop(ctx(t), guard), "Stop returns once the process exited on SIGTERM")
	readAll(t, br)
	s.requireKilledBy(t, wait(t, p), "SIGTERM")
}

func (s stopTests) testStopKillsAfterGrace(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "ignore-sigterm", "echo ready", "sleep 1h")
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "ready\n", readLine(t, br))
	require.NoError(t, p.Stop(ctx(t), 200*time.Millisecond))
	readAll(t, br)
	s.requireKilledBy(t, wait(t, p), "SIGKILL")
}

func (s stopTests) testStopWhileStreaming(t *testing.T) {
	sb := s.sandbox(t, nil)
	// 100 MB of stdout: the child is blocked on a full pipe when Stop comes.
	p := s.start(t, sb, sandbox.ProcSpec{}, "echo started", "lines 1000000 100")
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "started\n", readLine(t, br))
	require.NoError(t, p.Stop(ctx(t), guard))
	rest := readAll(t, br)
	require.Less(t, len(rest), 100*1000000, "the stream ended early")
	s.requireKilledBy(t, wait(t, p), "SIGTERM")
}

func (s stopTests) testStopAfterExit(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "exit 0")
	readAll(t, p.Stdout())
	wait(t, p)
	require.ErrorIs(t, p.Stop(ctx(t), time.Second), sandbox.ErrExited)

	p2 := s.start(t, sb, sandbox.ProcSpec{}, "sleep 1h")
	require.NoError(t, p2.Stop(ctx(t), guard))
	require.ErrorIs(t, p2.Stop(ctx(t), guard), sandbox.ErrExited, "a second Stop")
	readAll(t, p2.Stdout())
}

func (s stopTests) testGrandchildAfterExit(t *testing.T) {
	sb := s.sandbox(t, nil)
	// The grandchild keeps stdout open and sleeps: stdout reaches EOF and
	// Wait returns only if the provider ends the whole process group.
	out, st := s.run(t, sb, sandbox.ProcSpec{}, "fork-grandchild gc.pid", "echo forked", "exit 0")
	require.Equal(t, "forked\n", out)
	require.Equal(t, 0, st.Code)
	s.requireGrandchildGone(t, sb, "gc.pid")
}

func (s stopTests) testGrandchildAfterStop(t *testing.T) {
	sb := s.sandbox(t, nil)
	p := s.start(t, sb, sandbox.ProcSpec{}, "fork-grandchild gc.pid", "echo forked", "sleep 1h")
	br := bufio.NewReader(p.Stdout())
	require.Equal(t, "forked\n", readLine(t, br))
	require.NoError(t, p.Stop(ctx(t), guard))
	readAll(t, br)
	wait(t, p)
	s.requireGrandchildGone(t, sb, "gc.pid")
}

func (s stopTests) testSignals(t *testing.T) {
	for _, sig := range []string{"SIGKILL", "SIGTERM", "SIGINT"} {
		t.Run(sig, func(t *testing.T) {
			t.Parallel()
			sb := s.sandbox(t, nil)
			out, st := s.run(t, sb, sandbox.ProcSpec{}, "echo dying", "kill-self "+sig)
			require.Equal(t, "dying\n", out)
			s.requireKilledBy(t, st, sig)
		})
	}
}
