package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/internal/claudetest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// warmCLI is the real CLI against the fake API, with what the benchmarks
// of warm agents share.
type warmCLI struct {
	cli  string
	env  map[string]string
	dirs struct {
		sync.Mutex
		list []string // the warm sandboxes' working directories
	}
	local   *sandbox.Local
	seq     atomic.Int64
	profile warm.Profile
}

func newWarmCLI(t testing.TB) *warmCLI {
	w := &warmCLI{cli: claudetest.Path(t)}
	fake := anthropicfake.New(t, nil)
	w.env = fake.Env()
	w.env["IS_SANDBOX"] = "1"
	var err error
	w.local, err = sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(t.TempDir(), "sandboxes"), Env: w.env})
	require.NoError(t, err)
	w.profile, _ = warm.ProfileOf(&protocol.Job{ID: "b", Prompt: "b"}, warm.Placement{Sandbox: "local"})
	return w
}

// spawn is the pool's spawn hook: a sandbox per agent, as the worker's.
func (w *warmCLI) spawn(ctx context.Context, p warm.Profile) (warm.Spawned, error) {
	sb, err := w.local.Create(ctx, sandbox.Spec{ID: "warm-bench-" + strconv.FormatInt(w.seq.Add(1), 10)})
	if err != nil {
		return warm.Spawned{}, err
	}
	proc, err := sb.(sandbox.Interactive).StartInteractive(ctx, sandbox.ProcSpec{ID: "agent", Argv: p.Argv([]string{w.cli})})
	if err != nil {
		_ = sb.Destroy(context.Background())
		return warm.Spawned{}, err
	}
	w.dirs.Lock()
	w.dirs.list = append(w.dirs.list, sb.(sandbox.HostWorkDir).HostWorkDir())
	w.dirs.Unlock()
	return warm.Spawned{Process: proc, Release: sb.Destroy}, nil
}

func (w *warmCLI) pool(t testing.TB, n int) (*warm.Pool, <-chan warm.Event) {
	p, err := warm.New(warm.Config{N: n, Spawn: w.spawn, Profiles: []warm.Profile{w.profile}, Handshake: true})
	require.NoError(t, err)
	events := p.Events()
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
	return p, events
}

func awaitReady(t testing.TB, events <-chan warm.Event, n int) {
	timer := time.NewTimer(3 * time.Minute)
	defer timer.Stop()
	for n > 0 {
		select {
		case ev := <-events:
			if ev.Kind == warm.EventReady {
				n--
			}
		case <-timer.C:
			t.Fatalf("%d warm agents did not become ready", n)
		}
	}
}

// command is the CLI run directly (the baselines), with a HOME of its own.
func (w *warmCLI) command(t testing.TB, argv []string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	home := t.TempDir()
	c.Dir = home
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
	for k, v := range w.env {
		c.Env = append(c.Env, k+"="+v)
	}
	return c
}

// warmFigures are medians in milliseconds.
type warmFigures struct {
	warm, bare, floor float64
}

// warmStart measures, rounds times each, with the real CLI: a bare spawn
// of it (the one-shot argv, prompt on stdin) to its first line; a warm
// agent (Take, Begin) to its first line; and the CLI's own floor: an
// already-started CLI in input mode, from its first input to its first
// line.
func warmStart(t testing.TB, rounds int) warmFigures {
	w := newWarmCLI(t)
	var bare, floor, warmD []time.Duration
	for range rounds {
		bare = append(bare, w.bareFirstLine(t))
		floor = append(floor, w.floorFirstLine(t))
	}
	pool, events := w.pool(t, 1)
	for range rounds {
		awaitReady(t, events, 1)
		warmD = append(warmD, w.warmFirstLine(t, pool))
	}
	return warmFigures{warm: median(warmD), bare: median(bare), floor: median(floor)}
}

func (w *warmCLI) bareFirstLine(t testing.TB) time.Duration {
	c := w.command(t, agentArgv([]string{w.cli}))
	c.Stdin = strings.NewReader("hi")
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	t0 := time.Now()
	require.NoError(t, c.Start())
	br := bufio.NewReader(out)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	d := time.Since(t0)
	_, _ = io.Copy(io.Discard, br)
	require.NoError(t, c.Wait())
	return d
}

func (w *warmCLI) floorFirstLine(t testing.TB) time.Duration {
	c := w.command(t, w.profile.Argv([]string{w.cli}))
	in, err := c.StdinPipe()
	require.NoError(t, err)
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.Start())
	br := bufio.NewReader(out)
	_, err = in.Write([]byte(`{"type":"control_request","request_id":"b","request":{"subtype":"initialize"}}` + "\n"))
	require.NoError(t, err)
	for {
		line, err := br.ReadBytes('\n')
		require.NoError(t, err)
		var m struct{ Type string }
		if json.Unmarshal(line, &m) == nil && m.Type == "control_response" {
			break
		}
	}
	msg, err := warm.UserLine("hi")
	require.NoError(t, err)
	t0 := time.Now()
	_, err = in.Write(msg)
	require.NoError(t, err)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	d := time.Since(t0)
	require.NoError(t, in.Close())
	_, _ = io.Copy(io.Discard, br)
	require.NoError(t, c.Wait())
	return d
}

func (w *warmCLI) warmFirstLine(t testing.TB, pool *warm.Pool) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	a, ok := pool.Take(w.profile)
	require.True(t, ok, "a warm agent is ready")
	require.NoError(t, a.Begin(ctx, warm.Run{Tenant: "default", ID: "bench"}, "hi", true))
	br := bufio.NewReader(a.Stdout())
	_, err := br.ReadString('\n')
	require.NoError(t, err)
	d := time.Since(t0)
	_, _ = io.Copy(io.Discard, br)
	require.NoError(t, a.Close(ctx))
	return d
}

// warmIdleCPU is the CPU n idle warm agents (every process in their
// sandboxes) and this process (the pool's side) used over window.
func warmIdleCPU(t testing.TB, n int, window time.Duration) (agents, pool time.Duration) {
	w := newWarmCLI(t)
	_, events := w.pool(t, n)
	awaitReady(t, events, n)
	w.dirs.Lock()
	dirs := append([]string(nil), w.dirs.list...)
	w.dirs.Unlock()
	a0, h0 := dirsCPU(t, dirs), cpuTime(t)
	time.Sleep(window) // the measurement window, not a wait for an event
	a1, h1 := dirsCPU(t, dirs), cpuTime(t)
	return a1 - a0, h1 - h0
}

// dirsCPU is the user and system CPU of every process whose working
// directory is inside one of dirs.
func dirsCPU(t testing.TB, dirs []string) time.Duration {
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var ticks int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || !underAny(cwd, dirs) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
