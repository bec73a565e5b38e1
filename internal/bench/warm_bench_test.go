package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// Sizes of the warm-start benchmarks (docs/warm.md); the smoke test shrinks them.
type warmSizes struct {
	rounds, repoFiles, setupFiles, setupRounds, idleAgents int
	idleWindow                                             time.Duration
}

var fullWarm = warmSizes{rounds: 10, repoFiles: 20_000, setupFiles: 300, setupRounds: 3, idleAgents: 4, idleWindow: 60 * time.Second}

// BenchmarkFleetWarm measures the warm starts of docs/warm.md, each beside its
// baseline in the same run: a warm agent of the real CLI to its first
// line over a bare spawn of it (and the CLI's own floor), the second
// checkout of a repository through the repository cache (a prepared tree)
// over the first,
// restoring a cached setup over running it, and the CPU of idle warm
// agents.
func BenchmarkFleetWarm(b *testing.B) {
	b.Run("agents", func(b *testing.B) {
		f := warmStart(b, fullWarm.rounds)
		fmt.Printf("# warm: the real CLI against the fake API, medians of %d starts\n", fullWarm.rounds)
		figure("warm_first_line_ms", f.warm, "ms")
		figure("warm_bare_first_line_ms", f.bare, "ms")
		figure("warm_ratio", f.warm/f.bare, "ratio")
		figure("warm_cli_floor_first_line_ms", f.floor, "ms")
		figure("warm_cli_floor_ratio", f.floor/f.bare, "ratio")
		// The fleet's share is a difference of two medians: when noise makes
		// it negative it shows as 0 (make bench reads no minus sign).
		figure("warm_fleet_share_ms", max(0, f.warm-f.floor), "ms")
		b.ReportMetric(f.warm/f.bare, "warm_ratio")
	})
	b.Run("repocache", func(b *testing.B) {
		f := cacheCheckouts(b, fullWarm.repoFiles)
		fmt.Printf("# repocache: a %d-file repository over HTTP through pkg/workspace with a repository cache; the second checkout takes the tree prepared in the background after the first\n", fullWarm.repoFiles)
		figure("repocache_first_checkout_ms", f.first, "ms")
		figure("repocache_second_checkout_ms", f.second, "ms")
		figure("repocache_ratio", f.second/f.first, "ratio")
		figure("repocache_tree_prepare_ms", f.treePrepare, "ms")
		figure("repocache_objects_first_ms", f.objFirst, "ms")
		figure("repocache_objects_second_ms", f.objSecond, "ms")
		figure("repocache_objects_ratio", f.objSecond/f.objFirst, "ratio")
		b.ReportMetric(f.second/f.first, "repocache_ratio")
	})
	b.Run("setup", func(b *testing.B) {
		f := setupRestore(b, fullWarm.setupFiles, fullWarm.setupRounds)
		fmt.Printf("# setup: a script building %d files with sha256sum and gzip (%d files restored), medians of %d\n", 2*fullWarm.setupFiles, f.files, fullWarm.setupRounds)
		figure("setup_run_ms", f.run, "ms")
		figure("setup_restore_ms", f.restore, "ms")
		figure("setup_ratio", f.restore/f.run, "ratio")
		figure("setup_save_ms", f.save, "ms")
		// The restore above moves in a copy prepared in the background
		// between jobs; a job arriving before it is ready copies.
		figure("setup_prepare_ms", f.prepare, "ms")
		figure("setup_copy_restore_ms", f.copyRestore, "ms")
		b.ReportMetric(f.restore/f.run, "setup_ratio")
	})
	b.Run("idle", func(b *testing.B) {
		agents, pool := warmIdleCPU(b, fullWarm.idleAgents, fullWarm.idleWindow)
		fmt.Printf("# idle: %d warm agents of the real CLI over %s\n", fullWarm.idleAgents, fullWarm.idleWindow)
		figure("warm_idle_agents_cpu_ms", float64(agents.Milliseconds()), "ms")
		figure("warm_idle_pool_cpu_ms", float64(pool.Milliseconds()), "ms")
		figure("warm_idle_cpu_percent", 100*float64(agents+pool)/float64(fullWarm.idleWindow), "percent")
	})
}

// TestWarmBenchmarksRun runs the warm-start benchmarks at a small size so
// they cannot rot. It asserts sane figures, never speed.
func TestWarmBenchmarksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real CLI several times; skipped with -short")
	}
	f := warmStart(t, 1)
	require.Positive(t, f.warm)
	require.Positive(t, f.bare)
	require.Positive(t, f.floor)

	c := cacheCheckouts(t, 300)
	require.Positive(t, c.first)
	require.Positive(t, c.second)
	require.Positive(t, c.objFirst)
	require.Positive(t, c.objSecond)
	require.Equal(t, workspace.CacheMiss, c.firstBy, "the first checkout filled the cache")
	require.Equal(t, workspace.CacheTree, c.secondBy, "the second took the tree prepared after the first")
	require.Positive(t, c.treePrepare)

	s := setupRestore(t, 10, 1)
	require.Positive(t, s.run)
	require.Positive(t, s.restore)
	require.Equal(t, 20, s.files, "the 20 files the setup built")
	require.True(t, s.prepared, "the timed restores moved a prepared copy in")
	require.Positive(t, s.prepare)
	require.Positive(t, s.copyRestore)

	agents, pool := warmIdleCPU(t, 1, time.Second)
	require.GreaterOrEqual(t, agents, time.Duration(0))
	require.GreaterOrEqual(t, pool, time.Duration(0))
}
