package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestMain runs main in a child StartCommand made (fleettest.RunMain),
// and otherwise the tests, after which goleak fails the run if any
// goroutine is left (the in-process fleets stop theirs in Cleanup).
func TestMain(m *testing.M) {
	if os.Getenv(fleettest.MainEnv) == "1" {
		main()
		os.Exit(0)
	}
	fleettest.MainNoLeaks(m)
}

const wait = fleettest.CommandWait

// start runs `dispatcher args…` as a process against the fleet at url (""
// adds no --nats-url).
func start(t *testing.T, url string, args ...string) *fleettest.Command {
	t.Helper()
	if url != "" {
		args = append(args, "--nats-url", url)
	}
	return fleettest.StartCommand(t, args...)
}

func run(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	return start(t, url, args...).Wait(t)
}

func waitState(t *testing.T, f *fleettest.Fleet, tenant, id string, state protocol.State) {
	t.Helper()
	fleettest.Eventually(t, wait, func() bool {
		r, err := f.Client.Status(context.Background(), protocol.QueryRef{ID: id, Tenant: tenant})
		return err == nil && r.Status != nil && r.Status.State == state
	}, id+" "+string(state))
}

func TestCLIHelpAndVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "", "--help")
	require.Equal(t, 0, code, "dispatcher --help succeeds")
	for _, c := range []string{"serve", "submit", "tail", "status", "cancel", "ls", "version"} {
		require.Contains(t, out, "\n  "+c+" ")
	}
	code, _, errOut := run(t, "")
	require.Equal(t, fleetcli.ExitUsage, code, "no command is a usage error")
	require.Contains(t, errOut, "usage: dispatcher")

	code, out, _ = run(t, "", "submit", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: dispatcher submit [flags] [prompt words…]")
	require.Contains(t, out, "duplicate", "the description")
	require.Contains(t, out, "examples:\n  dispatcher submit --follow")
	require.Contains(t, out, "--nats-url", "common flags are listed")
	code, out, _ = run(t, "", "help", "cancel")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: dispatcher cancel [flags] <id>")

	code, _, _ = run(t, "", "serve", "--help")
	require.Equal(t, 0, code)
	code, out, _ = run(t, "", "version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^agentfleet \S+ \(go1\.\d+`, out)
	code, out, _ = run(t, "", "version", "--json")
	require.Equal(t, 0, code)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.NotEmpty(t, v["version"])
}

// Flags a command would ignore are refused, and values are checked before
// anything connects (no NATS at this URL: a usage error comes first).
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	const nowhere = "nats://127.0.0.1:1"
	for _, args := range [][]string{
		{"ls", "--state", "bogus"},
		{"ls", "--limit", "0"},
		{"ls", "--raw"},
		{"ls", "-A", "--tenant", "acme"},
		{"status", "--raw", "q1"},
		{"status", "-v", "q1"},
		{"cancel", "--raw", "q1"},
		{"status"},
		{"status", "a", "b"},
		{"tail", "bad id!"},
		{"submit", "--raw", "hi"},
		{"submit", "--color", "pink", "--follow", "hi"},
		{"submit", "--meta", "novalue", "hi"},
		{"submit", "--tenant", "no/slash", "hi"},
		{"status", "q1", "--log-level", "loud"},
		{"status", "q1", "--timeout", "0s"},
		{"frobnicate"},
		// Values that can never work: a usage error at once, not a
		// start that retries them forever or a zero taken as a default.
		{"serve", "--ack-wait", "500ms"},
		{"serve", "--replicas", "7"},
		{"serve", "--queries-max-age", "-1h"},
		{"serve", "--max-concurrency", "0"},
		{"serve", "--max-deliver", "0"},
		{"serve", "--admitter-lease", "0s"},
		{"serve", "--rate-limit-pause", "-1s"},
		{"serve", "--github-app-id", "5"},
		{"serve", "--github-app-id", "5", "--github-private-key", "/nonexistent.pem", "--github-webhook-secret", "s"},
		{"serve", "--github-webhook-secret", "s"},
		{"serve", "--github-app-id", "5", "--github-private-key", "/dev/null", "--github-webhook-secret", "s"},
		{"tenant", "github", "add", "acme"},
		{"tenant", "github", "add", "acme", "--repo", "not-a-repo"},
		{"tenant", "github", "ls", "--handle", "x"},
	} {
		code, _, errOut := run(t, nowhere, args...)
		require.Equal(t, fleetcli.ExitUsage, code, "%v: %s", args, errOut)
		require.NotContains(t, errOut, "cannot reach NATS", "%v", args)
	}
	code, _, errOut := run(t, nowhere, "status", "q1")
	require.Equal(t, fleetcli.ExitUnavailable, code)
	require.Contains(t, errOut, "cannot reach NATS at nats://127.0.0.1:1")
}

func TestCLINotFound(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	code, _, errOut := run(t, url, "cancel", "nope")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "no query default/nope")
	require.Contains(t, errOut, "the cancel is recorded anyway", "a job published straight to the queue has no status yet")
	// tail of an unknown id says so instead of waiting forever.
	code, _, errOut = run(t, url, "tail", "nope", "--tenant", "acme")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
	require.Contains(t, errOut, "no query acme/nope")
	code, _, _ = run(t, url, "status", "nope")
	require.Equal(t, fleetcli.ExitNotFound, code)
}

func TestCLIDuplicateSubmit(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	code, out, errOut := run(t, url, "submit", "--id", "dup-1", "--follow", "first")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "first")
	require.NotContains(t, errOut, "duplicate")
	code, out, errOut = run(t, url, "submit", "--id", "dup-1", "--follow", "second")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "duplicate: default/dup-1 was already submitted within the dedupe window; nothing new was queued")
	require.Contains(t, errOut, "following the earlier run")
	require.Contains(t, out, "first", "it follows the earlier run")
	require.NotContains(t, out, "second")
	code, out, errOut = run(t, url, "submit", "--id", "dup-1", "third")
	require.Equal(t, 0, code)
	require.Equal(t, "dup-1\n", out)
	require.Contains(t, errOut, "duplicate")
}

// Ctrl-C and SIGTERM stop following quietly: exit 128+signal, a hint to
// re-attach, no "context canceled"; the query keeps running.
func TestCLISignalDuringFollow(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	for _, tc := range []struct {
		id   string
		sig  syscall.Signal
		args []string
	}{
		{"sig-int", syscall.SIGINT, nil},
		{"sig-term-raw", syscall.SIGTERM, []string{"--raw"}},
	} {
		p := start(t, url, append([]string{"submit", "--id", tc.id, "--follow", "/standin lines=1 sleep=1h"}, tc.args...)...)
		p.Expect(t, "submitted default/"+tc.id)
		waitState(t, f, "default", tc.id, protocol.StateRunning)
		p.Signal(t, tc.sig)
		code, _, errOut := p.Wait(t)
		require.Equal(t, 128+int(tc.sig), code, errOut)
		require.Contains(t, errOut, "Re-attach with: dispatcher tail "+tc.id+" --tenant default")
		require.NotContains(t, errOut, "context canceled")
		r, err := f.Client.Status(context.Background(), protocol.QueryRef{ID: tc.id})
		require.NoError(t, err)
		require.Equal(t, protocol.StateRunning, r.Status.State, "the query keeps running")
		code, _, _ = run(t, url, "cancel", tc.id)
		require.Equal(t, 0, code)
	}
}

// A job no worker takes: --follow says where it stands instead of nothing.
func TestCLIFollowSaysWhyItWaits(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	p := start(t, url, "submit", "--id", "lonely", "--follow", "anyone?")
	l := p.Expect(t, "queued, ")
	require.Contains(t, l, "0 free slots asking for work, position 1 of 1")
	require.Regexp(t, `\(waiting \d+s\)$`, l)
	p.Signal(t, syscall.SIGINT)
	code, _, _ := p.Wait(t)
	require.Equal(t, 130, code)
}

func TestCLILogging(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	// Quiet by default, also when the connection closes at exit (about one
	// call in five used to print "WRN NATS disconnected").
	for range 8 {
		code, _, errOut := run(t, url, "status", "quiet")
		require.Equal(t, fleetcli.ExitNotFound, code)
		require.Equal(t, "not_found: no query default/quiet\n", errOut)
	}
	code, _, errOut := run(t, url, "status", "quiet", "--log-level", "debug")
	require.Equal(t, fleetcli.ExitNotFound, code)
	require.Contains(t, errOut, "DBG connected to NATS")
	code, _, errOut = run(t, url, "status", "quiet", "--log-level", "debug", "--log-format", "json")
	require.Equal(t, fleetcli.ExitNotFound, code)
	require.Contains(t, errOut, `{"level":"debug","url":"nats://127.0.0.1:`)
}

func TestCLIStatusAndLs(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	code, _, errOut := run(t, url, "submit", "--id", "ls-1", "--follow", "hello")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = run(t, url, "submit", "--tenant", "acme", "--id", "ls-2", "--follow", "/standin error=1")
	require.Equal(t, fleetcli.ExitFailed, code, errOut)
	waitState(t, f, "acme", "ls-2", protocol.StateFailed)
	waitState(t, f, "default", "ls-1", protocol.StateSucceeded)

	code, out, _ := run(t, url, "status", "ls-1", "--json=false")
	require.Equal(t, 0, code)
	require.Contains(t, out, "default/ls-1: succeeded · attempt 1 · worker ")
	require.Contains(t, out, "result: success · turns 1 · cost $")

	// ls lists the default tenant, as its help says; -A lists all.
	fleettest.Eventually(t, wait, func() bool {
		_, out, _ = run(t, url, "ls", "-A")
		return strings.Contains(out, "ls-1") && strings.Contains(out, "ls-2")
	}, "ls -A shows both tenants")
	require.Regexp(t, `(?m)^TENANT\s+ID\s+STATE\s+ATTEMPT\s+WORKER\s+DURATION\s+COST\s+AT\s+ERROR\s+WAITING$`, out)
	require.Regexp(t, `(?m)^default\s+ls-1\s+succeeded\s+1\s+\S+\s+\S+\s+\$0\.\d{4}\s`, out)
	code, out, _ = run(t, url, "ls")
	require.Equal(t, 0, code)
	require.Contains(t, out, "ls-1")
	require.NotContains(t, out, "ls-2")
	code, out, _ = run(t, url, "ls", "--tenant", "acme", "--state", "failed", "--json")
	require.Equal(t, 0, code)
	var qs []protocol.StatusEvent
	require.NoError(t, json.Unmarshal([]byte(out), &qs))
	require.Len(t, qs, 1)
	require.Equal(t, "ls-2", qs[0].ID)
	code, out, _ = run(t, url, "ls", "--state", "running", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, "[]\n", out)
}

// A cancelled run renders as cancelled, not as "failed (worker: cancelled)".
func TestCLIRendersCancel(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	url := f.Srv.ClientURL()
	p := start(t, url, "submit", "--id", "render-c", "--follow", "--color", "always", "/standin sleep=1h")
	p.Expect(t, "submitted")
	waitState(t, f, "default", "render-c", protocol.StateRunning)
	code, _, _ := run(t, url, "cancel", "render-c")
	require.Equal(t, 0, code)
	code, out, _ := p.Wait(t)
	require.Equal(t, fleetcli.ExitCancelled, code)
	require.Contains(t, out, "\x1b[31m✗ cancelled\x1b[0m")
	require.NotContains(t, out, "failed")
	require.Contains(t, out, "\x1b[33m[status] cancelled")
}
