package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shapeResult is one shape of make bench/fleet: jobs on workers worker
// processes of slots slots each, on one server or the 3-node cluster.
type shapeResult struct {
	workers, slots, jobs int
	cluster              bool
	replicas             int // of FLEET_QUERIES, as the server reports it
	rate                 float64
	cpu                  cpuSample // every nats-server node, the dispatcher, every worker
}

func (r shapeResult) cpuMS() float64 {
	return perJob(r.cpu.nats+r.cpu.dispatcher+r.cpu.worker, r.jobs)
}

// fleetShape runs jobs stand-in jobs with the prompt "hi" (the 3-line
// echo of make bench's dispatch) on a fresh fleet of workers worker
// processes sharing totalSlots slots, on one nats-server or, with cluster,
// three (streams R3), submitted as make bench's dispatch submits them; it
// measures jobs/s from the first submit to the last terminal status, and
// the CPU every fleet process spent meanwhile.
func fleetShape(t testing.TB, workers, totalSlots, jobs int, cluster bool) shapeResult {
	require.Zero(t, totalSlots%workers, "the slots divide among the workers")
	r := shapeResult{workers: workers, slots: totalSlots / workers, jobs: jobs, cluster: cluster}
	fp := startFleet(t, r.slots, "file", fleetOpts{workers: workers, cluster: cluster})
	require.Len(t, fp.workers, workers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := fp.js.Stream(ctx, fp.names.QueriesStream())
	require.NoError(t, err)
	r.replicas = s.CachedInfo().Config.Replicas
	done, stop := terminalWatcher(t, fp.nc, fp.names)
	defer stop()
	fp.settle(t) // the workers' and the dispatcher's start
	c0 := fp.cpu(t)
	start := time.Now()
	for i := range jobs {
		fp.submit(t, "default", "s"+strconv.Itoa(i), "hi")
	}
	waitTerminal(t, done, jobs, 30*time.Minute)
	r.rate = float64(jobs) / time.Since(start).Seconds()
	c1 := fp.cpu(t)
	r.cpu = cpuSample{nats: c1.nats - c0.nats, dispatcher: c1.dispatcher - c0.dispatcher, worker: c1.worker - c0.worker}
	return r
}

// fleetShapes are make bench/fleet's worker counts; the slots in all stay
// shapeSlots, so the shapes differ only in how many processes hold them.
var fleetShapes = []int{1, 4, 16}

const shapeSlots = 16

// BenchmarkWorkerShapes is make bench/fleet: jobs/s
// and CPU per job with 1, 4 and 16 worker processes (16 slots in all) on
// one nats-server and on a 3-node cluster, each beside its topology's
// 1-worker shape (target: flat within 20%). BENCH_FLEET_JOBS [10,000]
// jobs per shape. (Not named BenchmarkFleet*: make bench runs those.)
func BenchmarkWorkerShapes(b *testing.B) {
	jobs := 10_000
	envInt(b, "BENCH_FLEET_JOBS", &jobs, 1)
	fmt.Printf("# fleet shapes: %d jobs each (the 3-line echo), %d slots in all, file:// storage; ratios to the same topology's 1-worker shape\n", jobs, shapeSlots)
	single := map[int]shapeResult{}
	for _, cluster := range []bool{false, true} {
		var one shapeResult
		for _, w := range fleetShapes {
			prefix := "fleet_w" + strconv.Itoa(w)
			if cluster {
				prefix = "fleet_cluster_w" + strconv.Itoa(w)
			}
			b.Run(prefix, func(b *testing.B) {
				r := fleetShape(b, w, shapeSlots, jobs, cluster)
				if w == 1 {
					one = r
				}
				fmt.Printf("# %s: %d worker processes of %d slots, streams with %d replicas\n", prefix, r.workers, r.slots, r.replicas)
				printShape(prefix, r, one)
				if cluster {
					figure(prefix+"_to_single_jobs_ratio", r.rate/single[w].rate, "ratio")
				} else {
					single[w] = r
				}
			})
		}
	}
}

func printShape(prefix string, r, one shapeResult) {
	figure(prefix+"_jobs_per_s", r.rate, "jobs/s")
	figure(prefix+"_cpu_ms_per_job", r.cpuMS(), "ms")
	figure(prefix+"_nats_cpu_ms_per_job", perJob(r.cpu.nats, r.jobs), "ms")
	figure(prefix+"_dispatcher_cpu_ms_per_job", perJob(r.cpu.dispatcher, r.jobs), "ms")
	figure(prefix+"_worker_cpu_ms_per_job", perJob(r.cpu.worker, r.jobs), "ms")
	figure(prefix+"_jobs_ratio", r.rate/one.rate, "ratio")
	figure(prefix+"_cpu_ratio", r.cpuMS()/one.cpuMS(), "ratio")
}

// TestWorkerShapesRun runs make bench/fleet's harness at a tiny size (two
// worker processes on one server and on the cluster) so it cannot rot. It
// asserts that the shapes are what they say and the figures sane, never
// their speed.
func TestWorkerShapesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two fleets, one on a 3-node cluster; skipped with -short")
	}
	for _, cluster := range []bool{false, true} {
		r := fleetShape(t, 2, 4, 12, cluster)
		require.Equal(t, 2, r.slots)
		require.Positive(t, r.rate)
		require.Positive(t, r.cpuMS(), "the fleet's processes spent CPU on 12 jobs")
		want := 1
		if cluster {
			want = 3
		}
		require.Equal(t, want, r.replicas, "cluster %v: the dispatcher's streams' replicas", cluster)
	}
}
