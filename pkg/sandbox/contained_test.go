package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
	"github.com/stretchr/testify/require"
)

// requireContained fails (or, where namespaces cannot exist, skips with the
// reason) unless this machine can run contained sandboxes.
func requireContained(t *testing.T) {
	t.Helper()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
}

// TestContainedExercise runs the shared sandbox suite against contained
// sandboxes. Their processes live in a PID namespace of their own, so the
// suite cannot check pids from outside (LocalPIDs), and bwrap reports a
// signal's death as an exit code (SignalsReported).
func TestContainedExercise(t *testing.T) {
	requireContained(t)
	sandboxtest.Exercise(t, func(t *testing.T) sandbox.Provider {
		return setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained}).local
	}, sandboxtest.Features{SpawnErrors: true, Interactive: true})
}

// TestCheckContainedNamesWhatIsMissing: without bwrap on PATH the check,
// and a contained Local, say so.
func TestCheckContainedNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := sandbox.CheckContained()
	require.ErrorContains(t, err, "bubblewrap (bwrap) is not installed")
	_, err = sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Isolation: sandbox.IsolationContained})
	require.ErrorContains(t, err, "bubblewrap (bwrap) is not installed")
}

func TestContainedConfigValidates(t *testing.T) {
	root := t.TempDir()
	for name, cfg := range map[string]sandbox.LocalConfig{
		"unknown isolation":    {Root: root, Isolation: "jail"},
		"negative uid":         {Root: root, AgentUID: -1},
		"relative ro path":     {Root: root, ReadOnlyPaths: []string{"opt/claude"}},
		"ro path shows hidden": {Root: root, ReadOnlyPaths: []string{"/srv/fleet"}, HiddenPaths: []string{"/srv/fleet/worker.creds"}},
		"relative hidden":      {Root: root, HiddenPaths: []string{"data"}},
		"default over max":     {Root: root, DefaultLimits: sandbox.Limits{Pids: 500}, MaxLimits: sandbox.Limits{Pids: 100}},
		"cpu weight":           {Root: root, DefaultLimits: sandbox.Limits{CPUWeight: 20000}},
	} {
		_, err := sandbox.NewLocal(cfg)
		require.ErrorIs(t, err, sandbox.ErrInvalid, name)
	}
}

// TestContainedRejectsBadNetworkAndLimits: a forward on a bad port and
// limits above the maximum fail before any process starts.
func TestContainedRejectsBadNetworkAndLimits(t *testing.T) {
	requireContained(t)
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained, MaxLimits: sandbox.Limits{MemoryBytes: 1 << 30}})
	sb := b.create(t, "bad", nil)
	_, err := sb.Start(testCtx(t), sandbox.ProcSpec{ID: "a", Argv: sandboxtest.ChildArgv("echo x"),
		Network: &sandbox.Network{Forwards: []sandbox.Forward{{Port: 0, To: "127.0.0.1:1"}}}})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
	_, err = sb.Start(testCtx(t), sandbox.ProcSpec{ID: "b", Argv: sandboxtest.ChildArgv("echo x"),
		Limits: sandbox.Limits{MemoryBytes: 2 << 30}})
	require.ErrorIs(t, err, sandbox.ErrInvalid)
	require.ErrorContains(t, err, "above this worker's maximum")
	// Spec.Limits are every process's that names none: a sandbox made
	// with limits above the maximum refuses its processes too.
	over, err := b.local.Create(testCtx(t), sandbox.Spec{ID: "over", Limits: sandbox.Limits{MemoryBytes: 2 << 30}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = over.Destroy(context.Background()) })
	_, err = over.Start(testCtx(t), sandbox.ProcSpec{ID: "c", Argv: sandboxtest.ChildArgv("echo x")})
	require.ErrorContains(t, err, "above this worker's maximum", "the sandbox's limits applied")
	require.Error(t, sandbox.Limits{MemoryBytes: 2 << 30}.Within(sandbox.Limits{MemoryBytes: 1 << 30}))
	require.NoError(t, sandbox.Limits{MemoryBytes: 1 << 20}.Within(sandbox.Limits{MemoryBytes: 1 << 30}))
}

// TestContainedAgentOwnsWhatTheWorkerWrites: files the worker puts into a
// contained sandbox (WriteFile, session transcripts through HostConfigDir)
// are the agent uid's, so the agent can change them.
func TestContainedAgentOwnsWhatTheWorkerWrites(t *testing.T) {
	requireContained(t)
	if os.Geteuid() != 0 {
		t.Skip("ownership is handed over only by a root worker; otherwise the agent uid is the worker's")
	}
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "own", nil)
	require.NoError(t, sb.WriteFile(testCtx(t), "deep/dir/prompt.txt", []byte("x")))
	cfg := sb.(sandbox.HostConfigDir).HostConfigDir()
	require.NoError(t, os.MkdirAll(filepath.Join(cfg, "projects"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "projects", "s.jsonl"), []byte("parked"), 0o600))
	out, st := run(t, sb, sandbox.ProcSpec{}, "try-write deep/dir/prompt.txt", "try-write deep/dir/new.txt",
		"try-read "+filepath.Join(cfg, "projects", "s.jsonl"))
	require.Equal(t, 0, st.Code, st.StderrTail)
	require.Equal(t, "ok\nok\nok parked\n", out)
}

// TestContainedSpecNetworkIsEveryProcesss: Spec.Network applies to every
// process of the sandbox that names none (the worker decides a job's
// network once), and a ProcSpec.Network still wins.
func TestContainedSpecNetworkIsEveryProcesss(t *testing.T) {
	requireContained(t)
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	allow, err := egress.Parse([]byte(`{"allow":["example.com"]}`))
	require.NoError(t, err)
	sb, err := b.local.Create(testCtx(t), sandbox.Spec{ID: "spec-net", Network: &sandbox.Network{Policy: allow}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	env := childEnv(t, sb, sandbox.ProcSpec{})
	require.Equal(t, "http://127.0.0.1:3128", env["HTTPS_PROXY"], "the sandbox's network: behind the proxy")
	env = childEnv(t, sb, sandbox.ProcSpec{Network: &sandbox.Network{}})
	require.Empty(t, env["HTTPS_PROXY"], "the process's own network (none) wins")
	plain := b.create(t, "no-spec-net", nil)
	require.Empty(t, childEnv(t, plain, sandbox.ProcSpec{})["HTTPS_PROXY"])
}

// TestContainedAgentReadsTheSystemsEtc: the agent's uid can read what of
// /etc the sandbox gives it (the generated passwd, the CA certificates,
// the system git config), so git, TLS and user lookups work inside. A
// root worker's bwrap made /etc 0700 root's, and git in the agent's
// workspace failed ("unable to access '/etc/gitconfig'").
func TestContainedAgentReadsTheSystemsEtc(t *testing.T) {
	requireContained(t)
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "etc", nil)
	out, st := run(t, sb, sandbox.ProcSpec{}, "try-read /etc/passwd")
	require.Equal(t, 0, st.Code, st.StderrTail)
	require.Contains(t, out, "ok root:x:0:0")
	if _, err := os.Stat("/etc/gitconfig"); err == nil {
		out, st = run(t, sb, sandbox.ProcSpec{}, "try-read /etc/gitconfig")
		require.Equal(t, 0, st.Code, st.StderrTail)
		require.True(t, strings.HasPrefix(out, "ok"), out)
	}
}
