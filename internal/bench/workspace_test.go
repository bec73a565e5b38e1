package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// wsSizes is the generated repository and the capture workload.
type wsSizes struct {
	files, fileBytes, commits, rounds, changed int
}

// fullWS is a modest repository (2,000 files, about 16 MB of text over 3
// commits) so `make bench` stays short; larger ones (5,000 files, 50 MB)
// scale the same way (both sides fetch the same pack).
var fullWS = wsSizes{files: 2000, fileBytes: 8 << 10, commits: 3, rounds: 3, changed: 100}

// genRepo makes a bare repository of n files of about size bytes each,
// text that compresses like source code, over commits commits.
func genRepo(t testing.TB, dir string, sz wsSizes) string {
	work := filepath.Join(dir, "gen")
	workspacetest.Git(t, dir, "init", "-q", "-b", "main", work)
	rng := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("func return if else for range var const type struct interface map chan go defer select case switch package import error nil true false string int byte")
	for c := range sz.commits {
		for i := c; i < sz.files; i += sz.commits {
			var b strings.Builder
			for b.Len() < sz.fileBytes {
				fmt.Fprintf(&b, "%s %s_%d(%d) // %d\n", words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.IntN(1000), rng.IntN(1<<20), rng.Uint64())
			}
			p := filepath.Join(work, fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%05d.go", i))
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
		}
		workspacetest.Git(t, work, "add", "-A")
		workspacetest.Git(t, work, "commit", "-q", "-m", fmt.Sprintf("commit %d", c))
	}
	bare := filepath.Join(dir, "bench.git")
	workspacetest.Git(t, dir, "clone", "-q", "--bare", work, bare)
	return bare
}

func median(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// checkoutAndCapture measures, on one generated repository:
//   - checkout: a plain `git clone --depth 50` of it (baseline) against the
//     fleet's time from publishing a workspace job to its agent starting
//     (dispatch, sandbox, checkout), medians of sz.rounds;
//   - capture: the fleet's time from the agent's exit to the terminal
//     status for sz.changed new files (commit, manifest, diff and bundle
//     stored, artifact published) against the same git commands run
//     directly (add, commit, diff --binary, bundle create).
func checkoutAndCapture(t testing.TB, sz wsSizes) (cloneMS, fleetMS, captureMS, captureBaseMS float64) {
	dir := t.(interface{ TempDir() string }).TempDir()
	bare := genRepo(t, dir, sz)
	url := "file://" + bare

	f := fleettest.New(t, fleettest.Opts{})
	var mu sync.Mutex
	started, ended := map[string]time.Time{}, map[string]time.Time{}
	startedCh := make(chan string, 16)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) {
			mu.Lock()
			started[id] = time.Now()
			mu.Unlock()
			startedCh <- id
		}
		c.Test.RunEnded = func(_, id string, _ int) {
			mu.Lock()
			ended[id] = time.Now()
			mu.Unlock()
		}
	}})
	fleettest.WaitReady(t, w.W)
	terminal, stop := terminalWatcher(t, f.NC, f.Names)
	defer stop()
	submit := func(id, prompt string) time.Time {
		b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt, Workspace: &protocol.Workspace{Repo: url}})
		require.NoError(t, err)
		at := time.Now()
		f.PublishJob("default", b, nil)
		return at
	}
	// Interleaved, so both sides see the same machine load and page cache.
	var clones, fleet []time.Duration
	for i := range sz.rounds {
		start := time.Now()
		workspacetest.Git(t, dir, "clone", "-q", "--depth", "50", url, filepath.Join(dir, fmt.Sprintf("clone%d", i)))
		clones = append(clones, time.Since(start))
		id := fmt.Sprintf("co-%d", i)
		at := submit(id, "/standin")
		<-startedCh
		waitTerminal(t, terminal, 1, 10*time.Minute)
		mu.Lock()
		fleet = append(fleet, started[id].Sub(at))
		mu.Unlock()
	}

	var capture []time.Duration
	for i := range sz.rounds {
		id := fmt.Sprintf("cap-%d", i)
		submit(id, fmt.Sprintf("/standin many=%d", sz.changed))
		<-startedCh
		var end time.Time
		select {
		case ev := <-terminal:
			end = time.Now()
			require.Equal(t, protocol.StateSucceeded, ev.State)
			require.Equal(t, sz.changed, ev.Workspace.FilesChanged)
		case <-time.After(10 * time.Minute):
			t.Fatalf("capture run %s did not end", id)
		}
		mu.Lock()
		capture = append(capture, end.Sub(ended[id]))
		mu.Unlock()
	}

	var base []time.Duration
	for i := range sz.rounds {
		c := filepath.Join(dir, fmt.Sprintf("clone%d", i))
		head := workspacetest.Git(t, c, "rev-parse", "HEAD")
		require.NoError(t, os.MkdirAll(filepath.Join(c, "many"), 0o755))
		for j := range sz.changed {
			require.NoError(t, os.WriteFile(filepath.Join(c, "many", fmt.Sprintf("%04d.txt", j)), []byte(fmt.Sprintf("file %d\nstand-in\n", j)), 0o644))
		}
		start := time.Now()
		workspacetest.Git(t, c, "add", "-A")
		workspacetest.Git(t, c, "commit", "-q", "-m", "work")
		workspacetest.Git(t, c, "diff", "--numstat", head, "HEAD")
		_, err := workspacetest.GitErr(c, "diff", "--binary", head, "HEAD")
		require.NoError(t, err)
		workspacetest.Git(t, c, "bundle", "create", "-q", filepath.Join(dir, fmt.Sprintf("b%d", i)), "HEAD", "^"+head)
		base = append(base, time.Since(start))
	}
	return median(clones), median(fleet), median(capture), median(base)
}

func TestWorkspaceBenchmarkRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the fleet on a generated repository; skipped with -short")
	}
	clone, fleet, capture, base := checkoutAndCapture(t, wsSizes{files: 40, fileBytes: 512, commits: 2, rounds: 1, changed: 10})
	for _, v := range []float64{clone, fleet, capture, base} {
		require.Positive(t, v)
	}
}
