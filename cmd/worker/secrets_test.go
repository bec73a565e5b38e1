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
// of the worker's secrets (SPEC 3.3); the worker still works with them.
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
