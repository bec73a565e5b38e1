package e2e

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func runCLI(t *testing.T, url string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code := fleetcli.Run(ctx, append(args, "--nats-url", url), fleetcli.IO{In: strings.NewReader(stdin), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestCLI(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2, AgentMod: func(c *agent.Config) {
		c.Command = append(c.Command, "--standin-replay=tool-use-mcp")
	}})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()

	// submit --follow renders the run readably and exits with the query's code.
	code, out, errOut := runCLI(t, url, "", "submit", "--id", "cli-1", "--follow", "list", "the", "files")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "● session")
	require.Contains(t, out, "→ Task", "tool calls are shown")
	require.Contains(t, out, "←", "tool results are shown")
	require.Contains(t, out, "✓ done · turns")
	require.Contains(t, out, "[status] succeeded")

	// tail --raw replays the exact lines.
	code, out, _ = runCLI(t, url, "", "tail", "cli-1", "--raw")
	require.Equal(t, fleetcli.ExitOK, code)
	rec, err := os.ReadFile("../standin/sessions/tool-use-mcp.ndjson")
	require.NoError(t, err)
	require.Equal(t, string(rec), out)

	// status: JSON and exit code by state; unknown ids are not found.
	code, out, _ = runCLI(t, url, "", "status", "cli-1")
	require.Equal(t, fleetcli.ExitOK, code)
	require.Contains(t, out, `"state": "succeeded"`)
	code, _, _ = runCLI(t, url, "", "status", "nope")
	require.Equal(t, fleetcli.ExitNotFound, code)

	// The prompt can come from stdin; invalid jobs are rejected with code 6.
	code, out, _ = runCLI(t, url, "prompt from stdin", "submit", "--id", "cli-2")
	require.Equal(t, fleetcli.ExitOK, code)
	require.Equal(t, "cli-2\n", out)
	code, _, errOut = runCLI(t, url, "", "submit", "--max-turns", "0", "x")
	require.Equal(t, fleetcli.ExitRejected, code)
	require.Contains(t, errOut, "max_turns")

	// ls lists them; bad usage is code 2.
	fleettest.Eventually(t, wait, func() bool {
		_, out, _ = runCLI(t, url, "", "ls")
		return strings.Contains(out, "cli-1") && strings.Contains(out, "cli-2")
	}, "ls shows both queries")
	code, _, _ = runCLI(t, url, "", "tail")
	require.Equal(t, fleetcli.ExitUsage, code)
	code, _, _ = runCLI(t, url, "", "frobnicate")
	require.Equal(t, fleetcli.ExitUsage, code)
}

func TestCLICancelledAndFailedExitCodes(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	code, _, _ := runCLI(t, url, "", "submit", "--follow", "--id", "fail-1", "/standin noresult=1 exit=2")
	require.Equal(t, fleetcli.ExitFailed, code)

	done := make(chan int, 1)
	go func() {
		code, _, _ := runCLI(t, url, "", "submit", "--follow", "--id", "cancel-1", "/standin sleep=1h")
		done <- code
	}()
	fleettest.Eventually(t, wait, func() bool {
		rep, err := f.Client.Status(context.Background(), protocol.QueryRef{ID: "cancel-1"})
		return err == nil && rep.Status != nil && rep.Status.State == protocol.StateRunning
	}, "cancel-1 running")
	code, _, _ = runCLI(t, url, "", "cancel", "cancel-1")
	require.Equal(t, fleetcli.ExitOK, code)
	require.Equal(t, fleetcli.ExitCancelled, <-done)
	code, _, _ = runCLI(t, "nats://127.0.0.1:1", "", "status", "x")
	require.Equal(t, fleetcli.ExitUnavailable, code)
}
