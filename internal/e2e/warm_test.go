package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/envcache"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/repocache"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/warm"
	"github.com/agentfleet/agentfleet/pkg/workspace"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// warmFleet is a fleet with one worker keeping n warm agents, every
// sandboxed process of it marked with its own environment variable (so
// the test finds its processes), and the pool's events.
type warmFleet struct {
	f      *fleettest.Fleet
	w      *fleettest.Worker
	events <-chan warm.Event
	marker string
	// started receives the id of every run whose agent starts.
	started chan string
}

func newWarmFleet(t *testing.T, n int, mod func(*worker.Config)) *warmFleet {
	t.Helper()
	wf := &warmFleet{f: fleettest.New(t, fleettest.Opts{}), started: make(chan string, 16)}
	wf.marker = "WARMTEST_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, v, _ := strings.Cut(wf.marker, "=")
	events := make(chan (<-chan warm.Event), 1)
	wf.w = wf.f.StartWorker(fleettest.WorkerOpts{Slots: 2, SandboxEnv: map[string]string{k: v}, Mod: func(c *worker.Config) {
		c.Warm = n
		c.Test.WarmEvents = func(ch <-chan warm.Event) { events <- ch }
		c.Test.RunStarted = func(_, id string, _ int) { wf.started <- id }
		if mod != nil {
			mod(c)
		}
	}})
	fleettest.WaitReady(t, wf.w.W)
	if n > 0 {
		wf.events = <-events
	}
	return wf
}

// next waits for the pool's next event of kind k.
func (wf *warmFleet) next(t *testing.T, k warm.EventKind) warm.Event {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case ev := <-wf.events:
			if ev.Kind == k {
				return ev
			}
			t.Logf("warm pool event %d (%v)", ev.Kind, ev.Err)
		case <-timeout:
			t.Fatalf("no warm pool event %d", k)
		}
	}
}

// processes lists the pids of the processes carrying the fleet's marker.
func (wf *warmFleet) processes(t *testing.T) []int {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err == nil && slices.Contains(strings.Split(string(env), "\x00"), wf.marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func runningOf(t *testing.T, r fleettest.Run) protocol.StatusEvent {
	t.Helper()
	i := slices.IndexFunc(r.Statuses, func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
	require.GreaterOrEqual(t, i, 0, "a running status")
	return r.Statuses[i]
}

func requireWarm(t *testing.T, r fleettest.Run, want bool) {
	t.Helper()
	ev := runningOf(t, r)
	require.NotNil(t, ev.Warm, "running says warm:true|false")
	require.Equal(t, want, *ev.Warm, "running's warm")
}

func linesContain(r fleettest.Run, s string) bool {
	return slices.ContainsFunc(r.Lines, func(l fleetapi.Line) bool { return strings.Contains(string(l.Data), s) })
}

// A one-shot job takes the warm agent: running says warm:true, the
// result is the agent's answer to the job's prompt; the pool refills and
// the next job is warm too; so is a session, over two turns.
func TestWarmOneShotJobsTakeWarmAgents(t *testing.T) {
	t.Parallel()
	wf := newWarmFleet(t, 1, nil)
	wf.next(t, warm.EventReady)
	for i, id := range []string{"warm-1", "warm-2"} {
		if i > 0 {
			wf.next(t, warm.EventReady) // the replacement of the taken one
		}
		wf.f.SubmitJSON("default", id, "tell me about "+id+"-prompt")
		r := wf.f.Follow("default", id, wait)
		fleettest.RequireContiguous(t, r)
		require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
		requireWarm(t, r, true)
		require.True(t, linesContain(r, id+"-prompt"), "the agent answered the job's prompt")
	}

	wf.next(t, warm.EventReady)
	sw := watchStatus(t, wf.f, "default", "warm-session")
	submitSession(t, wf.f, "default", "warm-session", "session-first-prompt", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	sendCtl(t, wf.f, "default", "warm-session", input("session-second-input"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, wf.f, "default", "warm-session", protocol.CtlOp{Op: protocol.OpEnd})
	r := wf.f.Follow("default", "warm-session", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Equal(t, 2, r.Final.Turn)
	requireWarm(t, r, true)
	require.True(t, linesContain(r, "session-first-prompt") && linesContain(r, "session-second-input"), "both turns answered")
}

// A warm agent killed while it waits is replaced; stopping the worker
// stops every warm agent (no process of it is left).
func TestWarmAgentKilledWhileIdleIsReplacedAndDrainStopsThem(t *testing.T) {
	t.Parallel()
	wf := newWarmFleet(t, 1, nil)
	wf.next(t, warm.EventReady)
	pids := wf.processes(t)
	require.NotEmpty(t, pids, "the warm agent's processes")
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	wf.next(t, warm.EventDied)
	wf.next(t, warm.EventReady)
	replaced := wf.processes(t)
	require.NotEmpty(t, replaced)
	for _, pid := range replaced {
		require.NotContains(t, pids, pid, "a new agent")
	}

	wf.f.SubmitJSON("default", "after-kill", "after the kill")
	r := wf.f.Follow("default", "after-kill", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireWarm(t, r, true)

	wf.next(t, warm.EventReady)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, wf.w.W.Stop(ctx))
	fleettest.Eventually(t, wait, func() bool { return len(wf.processes(t)) == 0 }, "no warm agent process left after the worker stopped")
}

// setupLines reads what the query's .setup subject holds.
func setupLines(t *testing.T, f *fleettest.Fleet, id string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.Names.QuerySetup("default", id)}})
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	var out []string
	for uint64(len(out)) < info.NumPending {
		batch, err := cons.Fetch(int(info.NumPending)-len(out), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			out = append(out, string(m.Data()))
		}
		require.NoError(t, batch.Error())
	}
	return out
}

func submitSetupJob(t *testing.T, f *fleettest.Fleet, id, prompt, repo, setup string) {
	t.Helper()
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt, Workspace: &protocol.Workspace{Repo: repo}, Setup: setup})
	require.NoError(t, err)
	f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: id})
}

// cachedFleet is a warm fleet whose worker has the repository cache and
// the environment cache in one directory, as --repo-cache makes them.
func cachedFleet(t *testing.T) *warmFleet {
	wf, _ := cachedFleetIn(t)
	return wf
}

// cachedFleetIn is cachedFleet, with the caches' directory.
func cachedFleetIn(t *testing.T) (*warmFleet, string) {
	dir := t.TempDir()
	return newWarmFleet(t, 1, func(c *worker.Config) {
		repos, err := repocache.Open(repocache.Config{Dir: dir, AllowFile: true})
		require.NoError(t, err)
		envs, err := envcache.Open(envcache.Config{Dir: filepath.Join(dir, "envs")})
		require.NoError(t, err)
		ws, err := workspace.New(workspace.Config{Store: c.Checkpoints, AllowFile: true, Cache: repos, Logger: c.Logger})
		require.NoError(t, err)
		c.Workspaces, c.EnvCache = ws, envs
	}), dir
}

// A setup runs after the checkout and before the agent, its output on
// .setup; the second job of the same repository, script and inputs gets
// the environment restored (the script does not run again); the checkout
// the second time comes from the repository cache (hit). Workspace jobs
// start cold, and say so.
func TestSetupRunsOnceAndIsRestoredWithTheRepositoryCache(t *testing.T) {
	t.Parallel()
	wf := cachedFleet(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	marker := filepath.Join(t.TempDir(), "setup-ran")
	setup := "# inputs: deps.lock\necho installing deps\nmkdir -p vendor\necho built-by-setup > vendor/lib.txt\necho ran >> " + marker + "\necho done installing\n"

	submitSetupJob(t, wf.f, "setup-1", "/standin cat=vendor/lib.txt", repo.URL, setup)
	r := wf.f.Follow("default", "setup-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Equal(t, []string{"installing deps", "done installing"}, setupLines(t, wf.f, "setup-1"))
	require.True(t, linesContain(r, "built-by-setup"), "the agent saw what the setup built")
	requireWarm(t, r, false)
	first := runningOf(t, r)
	require.NotNil(t, first.Workspace)
	require.Equal(t, workspace.CacheMiss, first.Workspace.Cache, "the first checkout fills the mirror")

	submitSetupJob(t, wf.f, "setup-2", "/standin cat=vendor/lib.txt", repo.URL, setup)
	r = wf.f.Follow("default", "setup-2", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.Empty(t, setupLines(t, wf.f, "setup-2"), "a restored environment runs no setup")
	require.True(t, linesContain(r, "built-by-setup"), "the agent sees the restored environment")
	ran, err := os.ReadFile(marker)
	require.NoError(t, err)
	require.Equal(t, "ran\n", string(ran), "the setup ran once")
	second := runningOf(t, r)
	require.Equal(t, workspace.CacheHit, second.Workspace.Cache, "the second checkout is served from the cache")
}

// A failing setup ends the run failed with error.code setup and its
// output; the agent never starts.
func TestFailingSetupFailsTheRunWithItsOutput(t *testing.T) {
	t.Parallel()
	wf := cachedFleet(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	submitSetupJob(t, wf.f, "setup-bad", "never answered", repo.URL, "echo about to fail\necho on stderr >&2\nfalse\necho not reached\n")
	r := wf.f.Follow("default", "setup-bad", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.NotNil(t, r.Final.Error)
	require.Equal(t, protocol.CodeSetup, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "setup exited with status 1")
	require.Contains(t, r.Final.Error.Message, "about to fail")
	require.Contains(t, r.Final.Error.Message, "on stderr")
	require.Equal(t, []string{"about to fail", "on stderr"}, setupLines(t, wf.f, "setup-bad"))
	require.False(t, linesContain(r, "never answered"), "the agent never started")
	require.Empty(t, wf.started, "no agent started")
}

// Caches that cannot work (their directories broken under them, as a full
// disk would) fail nothing: the checkout is fetched cold and "running"
// says so with the reason; the setup runs and says its environment was
// not cached.
func TestBrokenCachesRunColdAndSaySo(t *testing.T) {
	t.Parallel()
	wf, dir := cachedFleetIn(t)
	for _, d := range []string{"mirrors", "envs"} {
		require.NoError(t, os.RemoveAll(filepath.Join(dir, d)))
		require.NoError(t, os.WriteFile(filepath.Join(dir, d), []byte("not a directory"), 0o600))
	}
	repo := workspacetest.NewRepo(t, t.TempDir())
	submitSetupJob(t, wf.f, "cold-1", "/standin cat=out.txt", repo.URL, "echo made > out.txt\necho setup ran\n")
	r := wf.f.Follow("default", "cold-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	require.True(t, linesContain(r, "made"), "the setup ran before the agent")
	running := runningOf(t, r)
	require.Equal(t, workspace.CacheCold, running.Workspace.Cache)
	require.NotEmpty(t, running.Workspace.CacheCold, "the reason the cache could not serve it")
	lines := setupLines(t, wf.f, "cold-1")
	require.Len(t, lines, 2, "%q", lines)
	require.Equal(t, "setup ran", lines[0])
	require.Contains(t, lines[1], "[fleet] setup environment not cached: ")
}

// A setup that does not finish is bounded by the job's timeout: the run
// fails with error.code setup, its output kept, the agent never started.
func TestHangingSetupEndsAtTheJobsTimeout(t *testing.T) {
	t.Parallel()
	wf := cachedFleet(t)
	repo := workspacetest.NewRepo(t, t.TempDir())
	timeout := 2
	b, err := json.Marshal(protocol.Job{ID: "setup-hang", Prompt: "never answered", Options: protocol.Options{TimeoutS: &timeout},
		Workspace: &protocol.Workspace{Repo: repo.URL}, Setup: "echo waiting forever\nsleep 600\n"})
	require.NoError(t, err)
	wf.f.PublishJob("default", b, map[string]string{protocol.HeaderMsgID: "setup-hang"})
	r := wf.f.Follow("default", "setup-hang", wait)
	require.Equal(t, protocol.StateFailed, r.Final.State)
	require.Equal(t, protocol.CodeSetup, r.Final.Error.Code)
	require.Contains(t, r.Final.Error.Message, "setup did not finish")
	require.Contains(t, r.Final.Error.Message, "waiting forever")
	require.Empty(t, wf.started, "no agent started")
}

// In a contained sandbox (docs/contained.md) the agent runs as another uid: what
// the setup left is restored for the second job as the agent's, which
// can change it.
func TestContainedSetupRestoreIsTheAgents(t *testing.T) {
	t.Parallel()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot be made here (.ci/run installs bubblewrap): %v", err)
	}
	dir := t.TempDir()
	wf := newWarmFleet(t, 0, func(c *worker.Config) {
		local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Isolation: sandbox.IsolationContained})
		require.NoError(t, err)
		c.Providers = map[string]sandbox.Provider{"local": local}
		repos, err := repocache.Open(repocache.Config{Dir: dir, AllowFile: true})
		require.NoError(t, err)
		envs, err := envcache.Open(envcache.Config{Dir: filepath.Join(dir, "envs")})
		require.NoError(t, err)
		ws, err := workspace.New(workspace.Config{Store: c.Checkpoints, AllowFile: true, Cache: repos, Logger: c.Logger})
		require.NoError(t, err)
		c.Workspaces, c.EnvCache = ws, envs
	})
	repo := workspacetest.NewRepo(t, t.TempDir())
	setup := "mkdir -p vendor\necho built-by-setup > vendor/lib.txt\necho setup ran\n"
	for i, id := range []string{"contained-1", "contained-2"} {
		submitSetupJob(t, wf.f, id, "/standin append=vendor/lib.txt cat=vendor/lib.txt", repo.URL, setup)
		r := wf.f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
		require.True(t, linesContain(r, `built-by-setup\nstand-in edit`), "the agent changed the setup's file: %s", r.Lines)
		if i == 1 {
			require.Empty(t, setupLines(t, wf.f, id), "restored, not run again")
		}
	}
}

// Warm agents start in contained sandboxes too (docs/contained.md): a one-shot job
// takes one and is answered.
func TestContainedWarmAgent(t *testing.T) {
	t.Parallel()
	if err := sandbox.CheckContained(); err != nil {
		t.Skipf("contained sandboxes cannot be made here (.ci/run installs bubblewrap): %v", err)
	}
	wf := newWarmFleet(t, 1, func(c *worker.Config) {
		local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), Isolation: sandbox.IsolationContained})
		require.NoError(t, err)
		c.Providers = map[string]sandbox.Provider{"local": local}
	})
	wf.next(t, warm.EventReady)
	wf.f.SubmitJSON("default", "contained-warm", "contained-warm-prompt")
	r := wf.f.Follow("default", "contained-warm", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final.Error)
	requireWarm(t, r, true)
	require.True(t, linesContain(r, "contained-warm-prompt"))
}
