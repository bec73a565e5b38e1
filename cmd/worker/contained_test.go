package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
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
	require.Contains(t, errOut, "set --isolation none or FLEET_ISOLATION=none explicitly")
	require.NotContains(t, errOut, "waiting for NATS")
}

// TestWorkerFailsClosedWithoutContainment: with --isolation unset, a
// worker that cannot contain its agents (no bubblewrap on PATH) does not
// start: exit 1 at once, before it connects, naming what is missing and
// how to allow uncontained agents. Before, it warned and ran every agent
// as its own user, beside its NATS credentials.
func TestWorkerFailsClosedWithoutContainment(t *testing.T) {
	t.Parallel()
	args := dirArgs(t, "--nats-url", "nats://127.0.0.1:1")
	code, _, errOut := fleettest.StartCommandEnv(t, []string{"PATH=" + t.TempDir()}, args...).Wait(t)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "local sandboxes cannot be contained here, so the worker does not start")
	require.Contains(t, errOut, "bubblewrap (bwrap) is not installed, or not on PATH")
	require.Contains(t, errOut, "set --isolation none or FLEET_ISOLATION=none explicitly")
	require.NotContains(t, errOut, "connecting to NATS")
}

// TestWorkerFailsClosedInAContainerThatMasksProc: where bwrap exists but
// cannot mount /proc (Docker's and Podman's default /proc masking; a bwrap
// on PATH that fails as it does there), the refusal says how to unmask it.
func TestWorkerFailsClosedInAContainerThatMasksProc(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "bwrap"),
		[]byte("#!/bin/sh\necho \"bwrap: Can't mount proc on /newroot/proc: Operation not permitted\" >&2\nexit 1\n"), 0o755))
	args := dirArgs(t, "--nats-url", "nats://127.0.0.1:1")
	code, _, errOut := fleettest.StartCommandEnv(t, []string{"PATH=" + bin + ":/usr/bin:/bin"}, args...).Wait(t)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "local sandboxes cannot be contained here")
	require.Contains(t, errOut, "Can't mount proc")
	require.Contains(t, errOut, "--security-opt unmask=/proc/*")
	require.Contains(t, errOut, "procMount: Unmasked")
	require.Contains(t, errOut, "FLEET_ISOLATION=none")
}

// TestWorkerRunsUncontainedOnlyWhenTold: --isolation none, by flag or by
// FLEET_ISOLATION, starts a worker that cannot contain, and it warns at
// start that its agents are not contained.
func TestWorkerRunsUncontainedOnlyWhenTold(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	for name, tc := range map[string]struct {
		env  []string
		args []string
	}{
		"flag": {nil, []string{"--isolation", "none"}},
		"env":  {[]string{"FLEET_ISOLATION=none"}, nil},
	} {
		env := append([]string{"PATH=" + t.TempDir()}, tc.env...)
		p := fleettest.StartCommandEnv(t, env, dirArgs(t, append(tc.args, "--nats-url", f.Srv.ClientURL(), "--slots", "1")...)...)
		l := p.Expect(t, "local agents are NOT contained")
		require.Contains(t, l, `"level":"warn"`, name)
		p.Expect(t, "pulling jobs")
		code, _, errOut := stopWorker(t, p)
		require.Equal(t, 0, code, "%s: %s", name, errOut)
	}
}

// TestCloudflareWorkerStartsWithoutLocalSandboxes: the fail-closed check is
// about local sandboxes. A worker whose default is Cloudflare starts where
// it cannot contain, without a local provider: a job asking for a local
// sandbox fails, naming it, and no agent runs uncontained.
func TestCloudflareWorkerStartsWithoutLocalSandboxes(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	p := fleettest.StartCommandEnv(t, []string{"PATH=" + t.TempDir()}, dirArgs(t, "--nats-url", f.Srv.ClientURL(), "--slots", "1",
		"--sandbox", "cloudflare", "--cf-bridge-url", "http://127.0.0.1:9", "--cf-bridge-token", "t")...)
	p.Expect(t, "local sandboxes are off")
	p.Expect(t, "pulling jobs")
	body, err := json.Marshal(protocol.Job{ID: "wants-local", Prompt: "/standin", Sandbox: protocol.SandboxLocal})
	require.NoError(t, err)
	f.PublishJob("default", body, nil)
	r := f.Follow("default", "wants-local", 2*time.Minute)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Contains(t, r.Final.Error.Message, `sandbox "local" is not configured on this worker`)
	code, _, errOut := stopWorker(t, p)
	require.Equal(t, 0, code, errOut)
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
