package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// containedLocal is a contained local provider (docs/contained.md) with the
// stand-in's directory bound read-only and env for every sandbox; root is
// its directory.
func containedLocal(t *testing.T, env map[string]string) (local *sandbox.Local, root string) {
	t.Helper()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	root = t.TempDir()
	local, err = sandbox.NewLocal(sandbox.LocalConfig{Root: root, Isolation: sandbox.IsolationContained,
		ReadOnlyPaths: []string{filepath.Dir(exe)}, Env: env})
	require.NoError(t, err)
	return local, root
}

// containedIfAsked makes a worker's local sandboxes contained, reaching
// the model at env's ANTHROPIC_BASE_URL through the worker's forward, when
// t runs under TestContainedClaudeSessions; nil otherwise.
func containedIfAsked(t *testing.T, env map[string]string) func(*worker.Config) {
	if !strings.HasPrefix(t.Name(), "TestContainedClaudeSessions/") {
		return nil
	}
	local, _ := containedLocal(t, env)
	return func(c *worker.Config) {
		c.Providers[protocol.SandboxLocal] = local
		c.Network = worker.NetworkConfig{Max: egress.Allow, ModelURL: env["ANTHROPIC_BASE_URL"]}
	}
}

// TestContainedClaudeSessions runs a session test with the real CLI
// through a worker whose sandboxes are contained, network none: turns
// queue, an interrupt ends one, the history carries; a workspace session
// parks and resumes with both turns' work (the checkout and its restore
// through the worker's git).
func TestContainedClaudeSessions(t *testing.T) {
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot run here: %v", err)
	}
	t.Run("TurnsQueueInterruptEnd", TestClaudeSessionTurnsQueueInterruptEnd)
	t.Run("WorkspaceSessionParkResumeKeepsTheWork", TestWorkspaceSessionParkResumeKeepsTheWork)
}

// TestContainedStandinSessionParksAndResumes: a contained session parks
// when its worker stops and resumes on another contained worker, the
// transcript restored into the new sandbox (and the agent's to change).
func TestContainedStandinSessionParksAndResumes(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	mod := func(c *worker.Config) {
		local, _ := containedLocal(t, nil)
		c.Providers[protocol.SandboxLocal] = local
	}
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Grace: 10 * time.Minute, Mod: mod})
	fleettest.WaitReady(t, a.W)
	sw := watchStatus(t, f, "default", "cst")
	submitSession(t, f, "default", "cst", "before the stop", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, a.W.Stop(ctx))
	sw.state(protocol.StateParked, 1)

	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: mod}).W)
	sendCtl(t, f, "default", "cst", input("after the stop"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "cst", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "cst", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Turn)
	last := string(r.Lines[len(r.Lines)-2].Data)
	require.Contains(t, last, "after the stop")
	require.Contains(t, last, "(1 earlier messages in this session)", "the resumed stand-in found the session's transcript")
}

// containedFleet is a fleet with one worker whose local sandboxes are
// contained (docs/contained.md), network as given, the stand-in's directory bound
// read-only; started reports each agent start.
func containedFleet(t *testing.T, netCfg worker.NetworkConfig, env map[string]string, agentMod func(*agent.Config)) (*fleettest.Fleet, chan string, string) {
	t.Helper()
	local, root := containedLocal(t, env)
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 4)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1, AgentMod: agentMod, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxLocal] = local
		c.Network = netCfg
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}}).W)
	return f, started, root
}

// TestContainedEgressRefusalIsPublished: a contained agent allowed one
// host asks the egress proxy for another; the refusal reaches the query's
// .egress subject as {"host","port","allowed":false} and the run goes on.
func TestContainedEgressRefusalIsPublished(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	require.NoError(t, err)
	script := fmt.Sprintf(`curl -s -m 20 -o /dev/null http://denied.example/; exec %q %s "$@"`, exe, fleettest.StandinFlag)
	f, _, _ := containedFleet(t, worker.NetworkConfig{Max: egress.Allow}, nil, func(c *agent.Config) {
		c.Command = []string{"/bin/sh", "-c", script, "agent"}
	})
	refusals := make(chan *nats.Msg, 4)
	sub, err := f.NC.ChanSubscribe(f.Names.QueryEgress("default", "egress-1"), refusals)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, f.NC.Flush())

	b, err := json.Marshal(protocol.Job{ID: "egress-1", Prompt: "hello", Network: json.RawMessage(`{"allow":["allowed.example"]}`)})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "egress-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	select {
	case m := <-refusals:
		require.JSONEq(t, `{"host":"denied.example","port":80,"allowed":false}`, string(m.Data))
	case <-time.After(wait):
		t.Fatal("no refusal on .egress")
	}
	// FLEET_QUERIES keeps it for replay.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	stored, err := st.GetLastMsgForSubject(ctx, f.Names.QueryEgress("default", "egress-1"))
	require.NoError(t, err)
	require.JSONEq(t, `{"host":"denied.example","port":80,"allowed":false}`, string(stored.Data))
}

// TestNetworkAboveMaxFailsAtOnce: a job asking for an allow list on a
// worker whose --network-max is none fails with network_not_allowed, and
// no agent starts.
func TestNetworkAboveMaxFailsAtOnce(t *testing.T) {
	t.Parallel()
	f, started, _ := containedFleet(t, worker.NetworkConfig{Max: egress.None}, nil, nil)
	b, err := json.Marshal(protocol.Job{ID: "net-max", Prompt: "hello", Network: json.RawMessage(`{"allow":["github.com"]}`)})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "net-max", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, egress.Code, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, `"allow"`)
	require.Empty(t, r.Lines)
	select {
	case id := <-started:
		t.Fatalf("an agent started for %s", id)
	default:
	}
	// A bad value is bad input.
	b, err = json.Marshal(protocol.Job{ID: "net-bad", Prompt: "hello", Network: json.RawMessage(`"sometimes"`)})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r = f.Follow("default", "net-bad", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeInvalidJob, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "sometimes")
}

// TestNetworkNamingTheWorkersLoopbackFailsAtOnce: a job whose allow list
// names the worker's machine (its metrics port, written as a hex address)
// or the cloud metadata address fails with network_not_allowed naming the
// entry, and no agent starts.
func TestNetworkNamingTheWorkersLoopbackFailsAtOnce(t *testing.T) {
	t.Parallel()
	f, started, _ := containedFleet(t, worker.NetworkConfig{Max: egress.Allow}, nil, nil)
	for id, entry := range map[string]string{"net-loop": "0x7f.1:9090", "net-meta": "169.254.169.254"} {
		b, err := json.Marshal(protocol.Job{ID: id, Prompt: "hello", Network: json.RawMessage(`{"allow":["github.com","` + entry + `"]}`)})
		require.NoError(t, err)
		f.PublishJob("default", b, nil)
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State, id)
		require.NotNil(t, r.Final.Error, id)
		require.Equal(t, egress.Code, r.Final.Error.Code, id)
		require.Contains(t, r.Final.Error.Message, "network.allow[1]", id)
		require.Contains(t, r.Final.Error.Message, egress.AllowFlag, id)
		require.Empty(t, r.Lines, id)
	}
	select {
	case id := <-started:
		t.Fatalf("an agent started for %s", id)
	default:
	}
}

// TestContainedWorkspaceRunEndToEnd: a workspace job in a contained
// sandbox, network none: the worker fetches the (file://, invisible inside)
// remote into the checkout, the agent commits and edits as its own uid,
// the capture's diff and artifact come back and the push reaches the
// remote.
func TestContainedWorkspaceRunEndToEnd(t *testing.T) {
	t.Parallel()
	f, _, _ := containedFleet(t, worker.NetworkConfig{Max: egress.Allow}, nil, nil)
	repo := workspacetest.NewRepo(t, t.TempDir())
	submitWorkspaceJob(t, f, "ws-contained", agentWork+" cat=src/a.go", protocol.Workspace{Repo: repo.URL, Push: true})
	r := f.Follow("default", "ws-contained", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	for _, l := range r.Lines {
		require.NotContains(t, string(l.Data), ": no such file", "a file directive failed: %s", l.Data)
	}
	require.Contains(t, string(r.Lines[len(r.Lines)-2].Data), "func A() int { return 1 }")
	art := artifactOf(t, f, "ws-contained")
	workspacetest.VerifyArtifact(t, context.Background(), f.Objects, repo, art, "default", "ws-contained")
	require.True(t, art.Pushed, art.PushError)
	require.Equal(t, art.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/fleet/default/ws-contained"))
	for _, l := range r.Lines {
		require.NotContains(t, string(l.Data), "commit agent_add_B:", "the agent's commit failed: %s", l.Data)
	}
	require.Equal(t, "stand-in <standin@agentfleet.invalid>",
		workspacetest.Git(t, repo.Bare, "log", "-1", "--format=%an <%ae>", art.EndSHA+"^"), "the agent's own commit is kept")
}

// TestContainedWorkspaceRealClaudeCode: the real CLI, contained with
// network none, reaches the fake Anthropic API only through the worker's
// model forward (NetworkConfig.ModelURL) and writes a file that comes back
// in the artifact.
func TestContainedWorkspaceRealClaudeCode(t *testing.T) {
	t.Parallel()
	claude := claudetest.Path(t)
	var root string
	fake := anthropicfake.New(t, func(r *anthropicfake.Request) anthropicfake.Reply {
		if len(r.ToolResults()) == 0 {
			dirs, _ := filepath.Glob(filepath.Join(root, "default-ws-claude-c-*", "work"))
			if len(dirs) != 1 {
				return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text(fmt.Sprintf("no single sandbox: %v", dirs))}}
			}
			return anthropicfake.Reply{Blocks: []anthropicfake.Block{
				anthropicfake.ToolUse("Write", map[string]any{"file_path": filepath.Join(dirs[0], "NOTES.md"), "content": "written by claude\n"}),
			}}
		}
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("wrote NOTES.md")}}
	})
	env := fake.Env()
	f, _, sbRoot := containedFleet(t, worker.NetworkConfig{Max: egress.Allow, ModelURL: env["ANTHROPIC_BASE_URL"]}, env,
		func(c *agent.Config) { c.Command = []string{claude} })
	root = sbRoot
	repo := workspacetest.NewRepo(t, t.TempDir())
	b, err := json.Marshal(protocol.Job{ID: "ws-claude-c", Prompt: "Write NOTES.md saying who wrote it.",
		Options: protocol.Options{PermissionMode: "acceptEdits"}, Workspace: &protocol.Workspace{Repo: repo.URL}})
	require.NoError(t, err)
	f.PublishJob("default", b, nil)
	r := f.Follow("default", "ws-claude-c", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	art := artifactOf(t, f, "ws-claude-c")
	require.Equal(t, []protocol.ArtifactFile{{Path: "NOTES.md", Status: protocol.FileAdded, Additions: 1}}, art.Files)
	diff, err := f.Objects.Get(context.Background(), storage.DiffKey("default", "ws-claude-c"))
	require.NoError(t, err)
	require.Contains(t, string(diff), "+written by claude")
}

// TestLimitsAboveMaxFailAtOnce: a job whose limits ask more than the
// worker's maximums fails with limits_not_allowed before any agent starts;
// bad limits are bad input; limits within the maximums run.
func TestLimitsAboveMaxFailAtOnce(t *testing.T) {
	t.Parallel()
	local, _ := containedLocal(t, nil)
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 4)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Providers[protocol.SandboxLocal] = local
		c.LimitsMax = sandbox.Limits{MemoryBytes: 512 << 20, Pids: 256}
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}}).W)
	publish := func(id string, l *protocol.Limits) {
		b, err := json.Marshal(protocol.Job{ID: id, Prompt: "hello", Limits: l})
		require.NoError(t, err)
		f.PublishJob("default", b, nil)
	}
	publish("lim-over", &protocol.Limits{MemoryMB: 1024})
	r := f.Follow("default", "lim-over", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeLimitsNotAllowed, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "above this worker's maximum")
	require.Empty(t, r.Lines)
	select {
	case id := <-started:
		t.Fatalf("an agent started for %s", id)
	default:
	}
	publish("lim-bad", &protocol.Limits{CPUWeight: 20000})
	r = f.Follow("default", "lim-bad", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeInvalidJob, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "limits.cpu_weight")

	publish("lim-ok", &protocol.Limits{MemoryMB: 256, Pids: 128})
	r = f.Follow("default", "lim-ok", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
}
