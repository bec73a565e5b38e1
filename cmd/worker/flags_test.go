package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// workerArgs are a worker command's arguments in a fresh directory, with
// extra last. The worker fails closed where it cannot contain: on such a
// machine the tests run their agents uncontained, on purpose (an
// --isolation in extra wins).
func workerArgs(t *testing.T, extra ...string) []string {
	if sandbox.CheckContained() != nil {
		extra = append([]string{"--isolation", "none"}, extra...)
	}
	return dirArgs(t, extra...)
}

// dirArgs is workerArgs with nothing about isolation.
func dirArgs(t *testing.T, extra ...string) []string {
	dir := t.TempDir()
	return append([]string{
		"--storage", "file://" + filepath.Join(dir, "data"), "--journal-dir", filepath.Join(dir, "journal"),
		"--sandbox-dir", filepath.Join(dir, "sb"), "--agent-cmd", strings.Join(fleettest.AgentCommand(t), " "),
	}, extra...)
}

// Settings that would fail later, or quietly mean something else, are
// refused at start with a message naming the flag (exit 2).
func TestWorkerRefusesBadFlags(t *testing.T) {
	t.Parallel()
	badPrices := filepath.Join(t.TempDir(), "prices.json")
	require.NoError(t, os.WriteFile(badPrices, []byte(`{"claude-new-6-0": {"input": -3, "output": 15}}`), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--slots", "0"}, "--slots must be between 1 and 1024, not 0"},
		{[]string{"--sandbox", "cloudflare"}, "--sandbox cloudflare needs --cf-bridge-url (env FLEET_CF_BRIDGE_URL)"},
		{[]string{"--sandbox", "docker"}, `--sandbox must be local or cloudflare, not "docker"`},
		{[]string{"serve", "now"}, `worker takes no arguments, only flags: "serve now"`},
		{[]string{"--warm", "-1"}, "--warm must be between 0 and 64, not -1"},
		{[]string{"--env-cache-spares", "-1"}, "--env-cache-spares must be between 0 and 16, not -1"},
		{[]string{"--agent-cmd", "no-such-agent-on-path --flag"}, `--agent-cmd: "no-such-agent-on-path" is not an executable on PATH (install Claude Code`},
		{[]string{"--agent-env", "PATH,ANTHROPIC_API_KEY"}, "--agent-env may not list ANTHROPIC_API_KEY: the model credential stays in the worker"},
		{[]string{"--agent-env", "CLAUDE_CODE_OAUTH_TOKEN"}, "--agent-env may not list CLAUDE_CODE_OAUTH_TOKEN"},
		{[]string{"--job-env-allow", "ANTHROPIC_BASE_URL"}, "--job-env-allow may not list ANTHROPIC_BASE_URL"},
		{[]string{"--job-env-allow", "anthropic_auth_token"}, "--job-env-allow may not list anthropic_auth_token"},
		{[]string{"--model-upstream", "ftp://models.example"}, `--model-upstream must be an http(s) URL or "off", not "ftp://models.example"`},
		{[]string{"--model-prices", badPrices}, "--model-prices " + badPrices + ": "},
		{[]string{"--model-prices", badPrices + ".missing"}, "no such file"},
	} {
		code, _, errOut := fleettest.StartCommand(t, workerArgs(t, append(tc.args, "--nats-url", "nats://127.0.0.1:1")...)...).Wait(t)
		require.Equal(t, 2, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want)
		require.NotContains(t, errOut, "waiting for NATS", "refused before connecting")
	}
	code, out, _ := fleettest.StartCommand(t, "--help").Wait(t)
	require.Equal(t, 0, code)
	_ = out
}

// A worker that cannot reach NATS says so with the URL instead of a vague
// "waiting for the work consumer".
func TestWorkerSaysItWaitsForNATS(t *testing.T) {
	t.Parallel()
	p := fleettest.StartCommand(t, workerArgs(t, "--nats-url", "nats://127.0.0.1:1", "--log-format", "console")...)
	l := p.Expect(t, "waiting for NATS")
	require.Contains(t, l, "nats_url=nats://127.0.0.1:1")
	p.Signal(t, syscall.SIGTERM)
	code, _, _ := p.Wait(t)
	require.Equal(t, 0, code)
}

// At start the worker says how long it needs to stop; SIGTERM stops it.
func TestWorkerPrintsShutdownGrace(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	p := fleettest.StartCommand(t, workerArgs(t, "--nats-url", f.Srv.ClientURL(), "--shutdown-grace", "20s", "--inbox-prefix", "_INBOX")...)
	l := p.Expect(t, "terminationGracePeriodSeconds")
	require.Contains(t, l, `"shutdown_grace":20000`)
	require.Contains(t, l, "running jobs get 20s to finish, then are handed back: allow this worker 1m20s before SIGKILL (e.g. terminationGracePeriodSeconds: 80)")
	p.Signal(t, syscall.SIGTERM)
	code, _, _ := p.Wait(t)
	require.Equal(t, 0, code)
}
