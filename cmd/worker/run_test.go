package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The test binary is also the worker command (fleettest.StartCommand);
// otherwise goleak checks that run left no goroutine behind, but the one
// that waits, for the process's life, for a second signal.
func TestMain(m *testing.M) {
	if os.Getenv(fleettest.MainEnv) == "1" {
		main()
		os.Exit(0)
	}
	fleettest.MainNoLeaks(m, goleak.IgnoreTopFunction("github.com/agentfleet/agentfleet/internal/config.ExitOnSecondSignal.func1"))
}

// The worker command's shutdown path, as SIGTERM drives it (the signal
// cancels run's context): it stops pulling, hands the running job back at
// once after --shutdown-grace, and exits 0; another worker finishes the job.
func TestRunShutsDownGracefullyAndHandsJobsBack(t *testing.T) {
	t.Parallel()
	// AckWait far beyond the test's waits: a redelivery seen here can only
	// come from the worker's Nak.
	f := fleettest.New(t, fleettest.Opts{AckWait: 10 * time.Minute})
	dir := t.TempDir()
	running := make(chan int, 4) // attempts that started running
	sub, err := f.NC.Subscribe(f.Names.QueryStatus("default", "term-1"), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.State == protocol.StateRunning {
			running <- ev.Attempt
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agentCmd := strings.Join(fleettest.AgentCommand(t), " ")
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, func() {}, []string{
			"--nats-url", f.Srv.ClientURL(), "--storage", "file://" + filepath.Join(dir, "data"),
			"--journal-dir", filepath.Join(dir, "journal"), "--sandbox-dir", filepath.Join(dir, "sb"),
			"--agent-cmd", agentCmd, "--slots", "1", "--shutdown-grace", "300ms", "--log-level", "error",
			"--inbox-prefix", "_INBOX",
		})
	}()
	f.SubmitJSON("default", "term-1", "/standin sleep=1h")
	select {
	case a := <-running:
		require.Equal(t, 1, a)
	case <-time.After(2 * time.Minute):
		t.Fatal("the job never ran")
	}
	cancel() // SIGTERM
	select {
	case code := <-exit:
		require.Equal(t, 0, code)
	case <-time.After(2 * time.Minute):
		t.Fatal("the worker did not exit")
	}
	// Handed back with a Nak, not left to time out: another worker runs it
	// as attempt 2 at once.
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	select {
	case a := <-running:
		require.Equal(t, 2, a)
	case <-time.After(2 * time.Minute):
		t.Fatal("the handed-back job was not continued")
	}
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "term-1"), []byte(`{"op":"cancel"}`)))
	r := f.Follow("default", "term-1", 3*time.Minute)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	require.Equal(t, 2, r.Final.Attempt)
	fleettest.RequireContiguous(t, r)
}
