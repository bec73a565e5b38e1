package warm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

// guard bounds every wait of a test; no assertion is about time.
const guard = 2 * time.Minute

// spawner spawns agents into sandboxes of a local provider and records
// what it did.
type spawner struct {
	t       *testing.T
	local   *sandbox.Local
	command []string
	seq     atomic.Int64

	mu       sync.Mutex
	procs    []sandbox.InteractiveProcess
	dirs     []string
	tokens   map[string]string // token minted at spawn -> run id bound at Begin ("" until bound)
	released int
	fail     int // the next fail spawns fail
	// prepare, if set, runs on a sandbox's working directory before the
	// agent starts in it.
	prepare func(dir string)
}

func newSpawner(t *testing.T, command []string, env map[string]string) *spawner {
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: filepath.Join(t.TempDir(), "sandboxes"), Env: env})
	require.NoError(t, err)
	return &spawner{t: t, local: local, command: command, tokens: map[string]string{}}
}

func (s *spawner) spawn(ctx context.Context, p warm.Profile) (warm.Spawned, error) {
	n := s.seq.Add(1)
	s.mu.Lock()
	if s.fail > 0 {
		s.fail--
		s.mu.Unlock()
		return warm.Spawned{}, os.ErrDeadlineExceeded
	}
	s.mu.Unlock()
	sb, err := s.local.Create(ctx, sandbox.Spec{ID: "warm-" + strconv.FormatInt(n, 10)})
	if err != nil {
		return warm.Spawned{}, err
	}
	if s.prepare != nil {
		s.prepare(sb.(sandbox.HostWorkDir).HostWorkDir())
	}
	token := "unbound-token-" + strconv.FormatInt(n, 10)
	env := p.EnvMap()
	if env == nil {
		env = map[string]string{}
	}
	env["FLEET_TEST_RUN_TOKEN"] = token
	proc, err := sb.(sandbox.Interactive).StartInteractive(ctx, sandbox.ProcSpec{ID: "agent", Argv: p.Argv(s.command), Env: env})
	if err != nil {
		_ = sb.Destroy(context.Background())
		return warm.Spawned{}, err
	}
	s.mu.Lock()
	s.procs = append(s.procs, proc)
	s.dirs = append(s.dirs, sb.(sandbox.HostWorkDir).HostWorkDir())
	s.tokens[token] = ""
	s.mu.Unlock()
	return warm.Spawned{
		Process: proc,
		Bind: func(_ context.Context, run warm.Run) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.tokens[token] = run.ID
			return nil
		},
		Release: func(ctx context.Context) error {
			s.mu.Lock()
			s.released++
			delete(s.tokens, token)
			s.mu.Unlock()
			return sb.Destroy(ctx)
		},
	}, nil
}

func (s *spawner) processes() []sandbox.InteractiveProcess {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sandbox.InteractiveProcess(nil), s.procs...)
}

func newPool(t *testing.T, cfg warm.Config) (*warm.Pool, <-chan warm.Event) {
	t.Helper()
	p, err := warm.New(cfg)
	require.NoError(t, err)
	events := p.Events()
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
	return p, events
}

// await waits for n events of kind, failing on a timeout.
func await(t *testing.T, events <-chan warm.Event, kind warm.EventKind, n int) {
	t.Helper()
	timer := time.NewTimer(guard)
	defer timer.Stop()
	for n > 0 {
		select {
		case ev := <-events:
			if ev.Kind == kind {
				n--
			}
		case <-timer.C:
			t.Fatalf("%d more events of kind %d did not come", n, kind)
		}
	}
}

// readUntilResult reads an agent's output lines up to its result line.
func readUntilResult(t *testing.T, a *warm.Agent) (lines []map[string]any, result map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(a.Stdout())
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		lines = append(lines, m)
		if m["type"] == "result" {
			return lines, m
		}
	}
	t.Fatalf("the agent ended without a result (%v) after %d lines", sc.Err(), len(lines))
	return nil, nil
}

// cpuTicks is the utime+stime, in clock ticks, of every process whose
// working directory is inside one of dirs (an agent and its children).
func cpuTicks(t *testing.T, dirs []string) (ticks int64, procs int) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || !inside(cwd, dirs) {
			continue
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
		procs++
	}
	return ticks, procs
}

func inside(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}
