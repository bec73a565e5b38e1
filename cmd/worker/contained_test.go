package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestWorkerRefusesContainedWithoutBubblewrap: --isolation contained on a
// machine without bwrap (a PATH lacking it) stops the worker with exit 1
// and what is missing, before it connects to anything.
func TestWorkerRefusesContainedWithoutBubblewrap(t *testing.T) {
	t.Parallel()
	args := workerArgs(t, "--isolation", "contained", "--nats-url", "nats://127.0.0.1:1")
	code, _, errOut := fleettest.StartCommandEnv(t, []string{"PATH=" + t.TempDir()}, args...).Wait(t)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "--isolation contained is not available here")
	require.Contains(t, errOut, "bubblewrap (bwrap) is not installed")
	require.NotContains(t, errOut, "waiting for NATS")
}

// TestWorkerRefusesBadContainFlags: the containment flags' bad values are
// usage errors (exit 2) naming the flag.
func TestWorkerRefusesBadContainFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent-uid", "0"}, "--agent-uid must be a positive uid (never 0), not 0"},
		{[]string{"--agent-uid", "-5"}, "--agent-uid must be a positive uid"},
		{[]string{"--isolation", "jail"}, `--isolation must be contained or none, not "jail"`},
		{[]string{"--network-default", "sometimes"}, "--network-default: network: invalid value"},
		{[]string{"--network-max", "all"}, "--network-max:"},
		{[]string{"--network-default", "open", "--network-max", "allow"}, "--network-default is above --network-max"},
		{[]string{"--egress-allow-private", "10/8"}, `--egress-allow-private: "10/8" is not a CIDR prefix`},
		{[]string{"--network-default", `{"allow":["127.0.0.1:9090"]}`}, "--network-default: network.allow[0]"},
		{[]string{"--limit-pids", "-1"}, "--limit-* must not be negative"},
		{[]string{"--limit-memory-mb", "2048", "--limit-memory-mb-max", "1024"}, "--limit-* defaults are above their maximums"},
		{[]string{"--limit-cpu-weight", "20000"}, "above 10000"},
	} {
		code, _, errOut := fleettest.StartCommand(t, workerArgs(t, append(tc.args, "--nats-url", "nats://127.0.0.1:1")...)...).Wait(t)
		require.Equal(t, 2, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, strings.Join(tc.args, " "))
	}
}
