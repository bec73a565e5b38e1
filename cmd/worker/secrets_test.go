package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// An agent reading the worker's /proc/<pid>/environ and cmdline finds none
// of the worker's secrets (docs/protocol.md); the worker still works with them.
// Before, the agent read FLEET_CF_BRIDGE_TOKEN, AWS_SECRET_ACCESS_KEY and
// the password in --nats-url there (found by QA). The scrub matters where
// the agent can see the worker's /proc: --isolation none (a contained
// agent has a PID namespace of its own and finds no such process).
func TestAgentCannotReadTheWorkersSecretsInProc(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := strings.Replace(f.Srv.ClientURL(), "nats://", "nats://fleet:pw-in-argv@", 1)
	p := fleettest.StartCommandEnv(t, []string{
		"AWS_SECRET_ACCESS_KEY=aws-in-env", "FLEET_CF_BRIDGE_TOKEN=bridge-in-env", "NATS_PASSWORD=nats-in-env",
	}, workerArgs(t, "--nats-url", url, "--cf-bridge-token", "tok-in-argv", "--slots", "1", "--log-level", "info",
		"--isolation", "none")...)
	p.Expect(t, "pulling jobs")
	pid := strconv.Itoa(p.Cmd.Process.Pid)

	f.SubmitJSON("default", "peek", "/standin cat=/proc/"+pid+"/environ cat=/proc/"+pid+"/cmdline")
	r := f.Follow("default", "peek", 2*time.Minute)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	var seen strings.Builder
	for _, l := range r.Lines {
		seen.Write(l.Data)
	}
	out := seen.String()
	require.Contains(t, out, "AWS_SECRET_ACCESS_KEY=", "the agent did read the worker's environ")
	require.Contains(t, out, "--cf-bridge-token", "and its cmdline")
	for _, secret := range []string{"aws-in-env", "bridge-in-env", "nats-in-env", "pw-in-argv", "tok-in-argv"} {
		require.NotContains(t, out, secret)
	}
	env, err := os.ReadFile("/proc/" + pid + "/environ")
	require.NoError(t, err)
	require.NotContains(t, string(env), "aws-in-env")
	p.Signal(t, syscall.SIGTERM)
	code, _, _ := p.Wait(t)
	require.Equal(t, 0, code)
}

// The model key is the gateway's (docs/gateway.md): a worker started with a
// real-looking ANTHROPIC_API_KEY and CLAUDE_CODE_OAUTH_TOKEN gives its
// agent a run token and the gateway's URL, and an agent that hunts for the
// keys in its environment, its argv, the worker's /proc environ and
// cmdline finds none of them (without the /proc scrub of the credential
// names it found them in the worker's environ).
func TestAgentCannotFindTheWorkersModelKey(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	key := "sk-ant-api03-" + strings.Repeat("hUnT", 20) + "-model-key-in-env"
	oauth := "sk-ant-oat01-" + strings.Repeat("oAtH", 20) + "-oauth-in-env"
	p := fleettest.StartCommandEnv(t, []string{"ANTHROPIC_API_KEY=" + key, "CLAUDE_CODE_OAUTH_TOKEN=" + oauth, "ANTHROPIC_AUTH_TOKEN=" + oauth},
		// --isolation none: a contained agent cannot see the worker's /proc
		// at all (pkg/sandbox's escape tests); this hunts where it can.
		workerArgs(t, "--nats-url", f.Srv.ClientURL(), "--slots", "1", "--log-level", "info", "--model-upstream", "http://127.0.0.1:9",
			"--isolation", "none")...)
	l := p.Expect(t, "model gateway started")
	require.NotContains(t, l, "hUnT")
	p.Expect(t, "pulling jobs")
	pid := strconv.Itoa(p.Cmd.Process.Pid)

	f.SubmitJSON("default", "hunt", "/standin dumpenv=1 cat=/proc/"+pid+"/environ cat=/proc/"+pid+"/cmdline cat=/proc/self/cmdline")
	r := f.Follow("default", "hunt", 2*time.Minute)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	var seen strings.Builder
	for _, l := range r.Lines {
		seen.Write(l.Data)
	}
	out := seen.String()
	require.Contains(t, out, "ANTHROPIC_API_KEY=fleet-run-", "the agent holds its run's token")
	require.Contains(t, out, "ANTHROPIC_BASE_URL=http://127.0.0.1:", "and the gateway's URL")
	require.Contains(t, out, "CLAUDE_CODE_OAUTH_TOKEN=", "the agent did read the worker's environ")
	for _, secret := range []string{"hUnThUnT", "oAtHoAtH", "model-key-in-env", "oauth-in-env"} {
		require.NotContains(t, out, secret)
	}
	code, _, errOut := stopWorker(t, p)
	require.Equal(t, 0, code)
	require.NotContains(t, errOut, "hUnT", "nor do the worker's logs hold it")
}

// stopWorker ends a worker command with SIGTERM.
func stopWorker(t *testing.T, p *fleettest.Command) (int, string, string) {
	p.Signal(t, syscall.SIGTERM)
	return p.Wait(t)
}
