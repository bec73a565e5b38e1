// Package bench holds the fleet's benchmarks (`make bench`). Each figure is
// printed as one line, `name value unit`, measured in one run on one embedded
// server beside its baseline, and reported as a ratio where a baseline
// exists. Run with: go test -run '^$' -bench . -benchtime 1x ./internal/bench/
package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

func figure(name string, value float64, unit string) {
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', 3, 64), unit)
}

// Sizes are the workloads; the smoke test shrinks them.
type sizes struct {
	relayLines, relayRounds, dispatchJobs, firstLineJobs, latencyLines, queuedJobs int
}

var full = sizes{relayLines: 150_000, relayRounds: 3, dispatchJobs: 1000, firstLineJobs: 200, latencyLines: 2000, queuedJobs: 10_000}

// terminalWatcher counts terminal status events.
func terminalWatcher(t testing.TB, nc *nats.Conn, names protocol.Names) (chan protocol.StatusEvent, func()) {
	ch := make(chan protocol.StatusEvent, 1<<16)
	sub, err := nc.Subscribe(names.StatusWildcard(), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.State.Terminal() {
			ch <- ev
		}
	})
	require.NoError(t, err)
	return ch, func() { _ = sub.Unsubscribe() }
}

func waitTerminal(t testing.TB, ch chan protocol.StatusEvent, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for i := 0; i < n; i++ {
		select {
		case ev := <-ch:
			require.Equal(t, protocol.StateSucceeded, ev.State, "query %s: %+v", ev.ID, ev.Error)
		case <-deadline:
			t.Fatalf("%d of %d queries finished in %s", i, n, timeout)
		}
	}
}

// relayResult is the relay benchmark's outcome: lines/s relayed by the
// fleet, by raw async publishing, and by raw async publishing with the
// fence's headers, and the CPU each spent per line.
type relayResult struct {
	fleet, base, fenced relayArm
	// archive is the fleet after each query's terminal status, until its
	// transcript is in storage (the archiver reading the lines back).
	archive relayArm
	// fleetProcs is fleet.cpu by process.
	fleetProcs cpuSample
	// roundRatios is fleet over baseline rate, round by round.
	roundRatios []float64
	lines       int
}

// relayArm is one side of the relay benchmark, summed over the rounds:
// lines sent, time taken, CPU spent (nats-server + dispatcher + worker for
// the fleet; nats-server + the harness's publisher for a baseline) and
// nats-server's part of it.
type relayArm struct {
	lines     int
	took      time.Duration
	cpu, nats time.Duration
}

func (a relayArm) rate() float64 { return float64(a.lines) / a.took.Seconds() }

func (a relayArm) usPerLine(d time.Duration) float64 {
	return float64(d) / float64(time.Microsecond) / float64(a.lines)
}

func (a *relayArm) add(b relayArm) {
	a.lines += b.lines
	a.took += b.took
	a.cpu += b.cpu
	a.nats += b.nats
}

// relay measures lines/s relayed from one agent writing 1 KiB lines on the
// fleet as processes (nats-server, dispatcher, worker), beside raw nats.go
// async publishing of the same payloads by the harness (same headers but
// the fence's, the same window of 256 in flight) into a stream configured
// like FLEET_QUERIES on the same server. A third arm, the fenced baseline,
// publishes raw with the fence's two headers too, against a status message,
// into a stream with consumers like the dispatcher's: the server's share of
// the fleet's guarantees (the fence's compare-and-set per line, and the
// durable status index and archiver), without anything of the worker's.
//
// The lines are split into rounds (BENCH_RELAY_ROUNDS, 3) and the arms run
// in a rotating order, each in every position once per three rounds, so a
// drift in the host's speed (it is a shared VM: one arm alone swung 1.3x
// within minutes) falls on every arm alike instead of on whichever ran in
// the slow minute. Every arm starts on a quiet fleet (fleetProcs.settle):
// measured back to back, the arm after the fleet's paid for the archiver
// reading the fleet's transcript back, and the arm after a baseline's for
// the deletion of its stream, which skewed a single pair by up to 1.5x
// depending on the order. Each arm's rate is its lines over its summed
// time. The fleet's time runs from a query's running status to its
// terminal one; the archiving that follows is measured apart.
func relay(t testing.TB, sz sizes) (r relayResult) {
	rounds := max(1, sz.relayRounds)
	per := max(1, sz.relayLines/rounds)
	r.lines = per * rounds
	fp := startFleetProcs(t, 1, "file")
	for round := range rounds {
		last := round == rounds-1
		var base, fenced, fleet relayArm
		arms := []func(){
			func() { base = rawRelay(t, fp, round, per, false, last) },
			func() { fenced = rawRelay(t, fp, round, per, true, last) },
			func() {
				var archive relayArm
				fleet, archive = fleetRelay(t, fp, round, per, last, &r.fleetProcs)
				r.archive.add(archive)
			},
		}
		for i := range arms {
			fp.settle(t)
			arms[(i+round)%len(arms)]()
		}
		r.base.add(base)
		r.fenced.add(fenced)
		r.fleet.add(fleet)
		r.roundRatios = append(r.roundRatios, fleet.rate()/base.rate())
	}
	return r
}

// relayPayload is every relayed line: 1 KiB of JSON, as the stand-in's
// size=1024 writes.
var relayPayload = []byte(`{"type":"assistant","text":"` + strings.Repeat("x", 1024-30) + `"}`)

// rawRelay publishes n lines with nats.go's async publishing (256 in
// flight) into a fresh stream configured like FLEET_QUERIES, with the
// fence's headers against a status message and three filtered durable
// consumers if fenced. The stream is
// deleted afterwards: its messages and their Msg-IDs (the server's
// duplicate window holds each for two minutes) would otherwise cost the
// server memory and GC time during the next arm.
func rawRelay(t testing.TB, fp *fleetProcs, round, n int, fenced, profile bool) relayArm {
	ctx := context.Background()
	cfg := jetstream.StreamConfig{
		Name: "BASELINE", Subjects: []string{"baseline.>"}, Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute, AllowDirect: true,
	}
	_, err := fp.js.CreateOrUpdateStream(ctx, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, fp.js.DeleteStream(ctx, cfg.Name)) }()
	js, err := jetstream.New(fp.nc, jetstream.WithPublishAsyncMaxPending(256))
	require.NoError(t, err)
	q := "q" + strconv.Itoa(round)
	status := "baseline.default." + q + ".status"
	var token string
	if fenced {
		// FLEET_QUERIES always has the dispatcher's durable consumers
		// (status index and archiver on .status, sessions on .ctl); with
		// any consumer, the server wakes a goroutine per stored message,
		// matching or not.
		for i, f := range []string{"baseline.*.*.status", "baseline.*.*.status", "baseline.*.*.ctl"} {
			_, err := js.CreateOrUpdateConsumer(ctx, cfg.Name, jetstream.ConsumerConfig{
				Durable: "c" + strconv.Itoa(i), FilterSubject: f, AckPolicy: jetstream.AckExplicitPolicy,
			})
			require.NoError(t, err)
		}
		ack, err := js.Publish(ctx, status, []byte(`{"state":"running"}`))
		require.NoError(t, err)
		token = strconv.FormatUint(ack.Sequence, 10)
	}
	prefix := "baseline-"
	if fenced {
		prefix = "fenced-"
	}
	wait := func() {}
	if profile {
		wait = fp.profile(t, prefix, time.Second)
	}
	defer wait()
	c0, h0 := fp.cpu(t), cpuTime(t)
	start := time.Now()
	for i := range n {
		m := nats.NewMsg("baseline.default." + q + ".msg")
		m.Data = relayPayload
		seq := strconv.Itoa(i + 1)
		m.Header.Set(protocol.HeaderSeq, seq)
		m.Header.Set(protocol.HeaderAttempt, "1")
		m.Header.Set(protocol.HeaderMsgID, "default."+q+".1."+seq)
		m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		if fenced {
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, status)
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, token)
		}
		publishAsync(js, m)
	}
	waitPublished(t, js)
	took := time.Since(start)
	c1, h1 := fp.cpu(t), cpuTime(t)
	info, err := js.Stream(ctx, cfg.Name)
	require.NoError(t, err)
	want := uint64(n)
	if fenced {
		want++
	}
	require.Equal(t, want, info.CachedInfo().State.Msgs, "every baseline line stored")
	return relayArm{lines: n, took: took, cpu: c1.nats - c0.nats + h1 - h0, nats: c1.nats - c0.nats}
}

// publishAsync publishes m asynchronously, waiting for room when the
// window of publishes in flight is full.
func publishAsync(js jetstream.JetStream, m *nats.Msg) {
	for {
		if _, err := js.PublishMsgAsync(m); err == nil {
			return
		}
		<-js.PublishAsyncComplete()
	}
}

// waitPublished waits until every asynchronous publish of js is acknowledged.
func waitPublished(t testing.TB, js jetstream.JetStream) {
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		t.Fatal("asynchronous publishes not acknowledged in 5 minutes")
	}
}

// fleetRelay runs one query whose agent writes n lines of 1 KiB and times
// it from its running status to its terminal one; procs gets the fleet's
// CPU by process added. The second arm is the archiving that follows:
// from the terminal status until the transcript is in storage.
func fleetRelay(t testing.TB, fp *fleetProcs, round, n int, profile bool, procs *cpuSample) (relayArm, relayArm) {
	type stamp struct {
		state protocol.State
		at    time.Time
	}
	id := "relay-" + strconv.Itoa(round)
	states := make(chan stamp, 16)
	sub, err := fp.nc.Subscribe(fp.names.QueryStatus("default", id), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			states <- stamp{ev.State, time.Now()}
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	wait := func() {}
	if profile {
		wait = fp.profile(t, "", time.Second)
	}
	defer wait()
	c0 := fp.cpu(t)
	fp.submit(t, "default", id, fmt.Sprintf("/standin lines=%d size=1024", n))
	var started time.Time
	deadline := time.After(10 * time.Minute)
	for {
		var st stamp
		select {
		case st = <-states:
		case <-deadline:
			t.Fatal("the relay job did not finish in 10 minutes")
		}
		if st.state == protocol.StateRunning && started.IsZero() {
			started = st.at
		}
		if st.state.Terminal() {
			require.Equal(t, protocol.StateSucceeded, st.state)
			require.False(t, started.IsZero(), "no running status before the terminal one")
			c1 := fp.cpu(t)
			d := cpuSample{nats: c1.nats - c0.nats, dispatcher: c1.dispatcher - c0.dispatcher, worker: c1.worker - c0.worker}
			procs.nats += d.nats
			procs.dispatcher += d.dispatcher
			procs.worker += d.worker
			// The stand-in writes a system line, the n lines and a result.
			relay := relayArm{lines: n + 3, took: st.at.Sub(started), cpu: d.nats + d.dispatcher + d.worker, nats: d.nats}
			transcript := filepath.Join(fp.dataDir, filepath.FromSlash(storage.TranscriptKey("default", id)))
			fleettest.Eventually(t, 5*time.Minute, func() bool {
				_, err := os.Stat(transcript)
				return err == nil
			}, "the relay query's transcript archived")
			c2 := fp.cpu(t)
			archive := relayArm{lines: n + 3, took: time.Since(st.at),
				cpu: c2.nats - c1.nats + c2.dispatcher - c1.dispatcher + c2.worker - c1.worker, nats: c2.nats - c1.nats}
			return relay, archive
		}
	}
}

// dispatchShape is the dispatch workload: how many jobs, how many run at once
// (the worker's slots, and the baseline's parallel spawns), and what each
// agent writes. BENCH_SLOTS and BENCH_LINES change it, for `make bench/scale`.
type dispatchShape struct {
	jobs, slots, lines int
	storage            string // BENCH_STORAGE: "file" (file://) or "nats" (nats://)
}

func (d dispatchShape) prompt() string {
	if d.lines <= 0 {
		return "hi" // the stand-in echoes it: three lines
	}
	return fmt.Sprintf("/standin lines=%d size=200", d.lines)
}

// shapeFromEnv applies BENCH_SLOTS, BENCH_LINES and BENCH_JOBS to the default
// workload; with more lines per job, fewer jobs keep the run bounded.
func shapeFromEnv(t testing.TB, jobs int) dispatchShape {
	d := dispatchShape{jobs: jobs, slots: 8}
	envInt(t, "BENCH_SLOTS", &d.slots, 1)
	envInt(t, "BENCH_LINES", &d.lines, 0) // 0: the 3-line echo (make bench/scale)
	if d.lines > 0 {
		d.jobs = min(d.jobs, max(10, 200_000/d.lines))
	}
	envInt(t, "BENCH_JOBS", &d.jobs, 1)
	d.storage = cmp.Or(os.Getenv("BENCH_STORAGE"), "file")
	if d.storage != "file" && d.storage != "nats" {
		t.Fatalf("BENCH_STORAGE=%q: want file or nats", d.storage)
	}
	return d
}

// envInt sets *into from the environment variable name, if set; it must be
// a whole number of at least least.
func envInt(t testing.TB, name string, into *int, least int) {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, name)
		require.GreaterOrEqual(t, n, least, name)
		*into = n
	}
}

// cpuTime is this process's user+system CPU so far (getrusage, the counters
// /proc/self/stat shows): the harness's own (submitting, watching, the
// baselines' spawning and publishing). The fleet runs as processes of its
// own (procs_test.go); the agents are children and are not counted.
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type dispatchResult struct {
	fleetRate, baseRate float64
	cpu                 cpuSample // per process, over the run
	harness             time.Duration
	baseCPU             time.Duration // the baseline's spawning and reading
	natsIn, natsOut     int64         // messages into and out of the server
	natsSubs            int64         // subscriptions the server added
	jobs                int
	// createUS: CPU per file creation in the fleet's filesystem, before
	// the fleet's run and after it (fileCreateCPU).
	createUS [2]float64
	// floor: the same number of jobs as bare clients exchanging only the
	// messages a job needs, on the same server (jobFloor).
	floor floorResult
	// asynq: the same jobs on asynq and Redis (asynq_test.go).
	asynq asynqResult
}

// fileCreateCPU measures the CPU (of the calling thread) that creating an
// empty file costs in dir's filesystem right now, in µs. It is the host's
// figure the fleet's own files pay (status records, transcripts, sandbox
// directories): on ext4 without a journal, a new inode costs a scan over
// the inodes deleted there in the last minutes (find_inode_bit,
// recently_deleted), so it swings by two orders of magnitude with what the
// machine deleted before, this benchmark's earlier runs included.
func fileCreateCPU(t testing.TB, dir string) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	threadCPU := func() time.Duration {
		var ru unix.Rusage
		require.NoError(t, unix.Getrusage(unix.RUSAGE_THREAD, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const n = 300
	dir, err := os.MkdirTemp(dir, "create-probe")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	c0 := threadCPU()
	for i := range n {
		fd, err := unix.Open(filepath.Join(dir, strconv.Itoa(i)), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd))
	}
	return float64(threadCPU()-c0) / float64(time.Microsecond) / n
}

func perJob(d time.Duration, jobs int) float64 {
	return float64(d) / float64(time.Millisecond) / float64(jobs)
}

// fleetCPUms is the CPU the fleet spent per job: nats-server + dispatcher +
// worker, each read from /proc; the harness that submits and watches is
// not counted, and neither are the agents (children of the worker).
func (r dispatchResult) fleetCPUms() float64 {
	return perJob(r.cpu.nats+r.cpu.dispatcher+r.cpu.worker, r.jobs)
}

// dispatch measures jobs/s for d.jobs stand-in jobs on one worker with
// d.slots slots, beside spawning and reaping the same stand-in with the same
// prompt d.slots at a time; and the CPU per job each process spent (the
// fleet's three from /proc; the baseline's own spawning and reading).
func dispatch(t testing.TB, d dispatchShape) (r dispatchResult) {
	r.jobs = d.jobs
	argv := agentArgv(standin(t))
	var next atomic.Int64
	cpu0 := cpuTime(t)
	start := time.Now()
	var wg sync.WaitGroup
	for range d.slots {
		wg.Go(func() {
			for next.Add(1) <= int64(d.jobs) {
				c := exec.Command(argv[0], argv[1:]...)
				c.Stdin = strings.NewReader(d.prompt())
				out, err := c.StdoutPipe()
				if err != nil {
					panic(err)
				}
				if err := c.Start(); err != nil {
					panic(err)
				}
				_, _ = io.Copy(io.Discard, out)
				_ = c.Wait()
			}
		})
	}
	wg.Wait()
	r.baseRate = float64(d.jobs) / time.Since(start).Seconds()
	r.baseCPU = cpuTime(t) - cpu0
	r.asynq = asynqBaseline(t, d, argv) // the same jobs on asynq, between the bare spawns and the fleet

	fp := startFleetProcs(t, d.slots, d.storage)
	r.createUS[0] = fileCreateCPU(t, fp.dataDir)
	done, stop := terminalWatcher(t, fp.nc, fp.names)
	defer stop()
	tr := traceAll(t, fp.nc)
	in0, out0 := fp.natsMsgs(t)
	subs0 := fp.natsSubInserts(t)
	c0, h0 := fp.cpu(t), cpuTime(t)
	start = time.Now()
	waitProfiles := fp.profile(t, "", time.Duration(float64(d.jobs)/r.baseRate*float64(time.Second)))
	for i := range d.jobs {
		fp.submit(t, "default", "d"+strconv.Itoa(i), d.prompt())
	}
	waitTerminal(t, done, d.jobs, 10*time.Minute)
	r.fleetRate = float64(d.jobs) / time.Since(start).Seconds()
	c1, h1 := fp.cpu(t), cpuTime(t)
	r.cpu = cpuSample{nats: c1.nats - c0.nats, dispatcher: c1.dispatcher - c0.dispatcher, worker: c1.worker - c0.worker}
	r.harness = h1 - h0
	in1, out1 := fp.natsMsgs(t)
	tr()
	r.natsIn, r.natsOut = in1-in0, out1-out0
	r.natsSubs = fp.natsSubInserts(t) - subs0
	waitProfiles()
	r.createUS[1] = fileCreateCPU(t, fp.dataDir)
	fp.settle(t) // the archiver's last transcripts
	r.floor = jobFloor(t, fp, d.jobs, d.slots)
	return r
}

func percentile(d []time.Duration, p float64) float64 {
	slices.Sort(d)
	i := int(float64(len(d)-1) * p)
	return float64(d[i]) / float64(time.Millisecond)
}

// standin builds the stand-in agent the fleet's worker runs in these
// benchmarks (bin/fleet-standin-agent, `--agent-cmd`), so that every
// baseline spawns the same program as the fleet: the test binary in
// stand-in mode is a far larger program, and a baseline that spawns it
// measures the fleet against slower work.
func standin(t testing.TB) []string {
	return []string{build(t, t.TempDir(), "./cmd/fleet-standin-agent")}
}

// agentArgv is the argv the worker gives a one-shot job with no options:
// the command and agent.BaseArgs.
func agentArgv(cmd []string) []string { return agent.BuildArgv(cmd, protocol.Options{}) }

// bareSpawn is the baseline of first-line latency: it spawns the same
// stand-in with the same argv and prompt as the fleet's worker and returns
// how long its first stdout line took.
func bareSpawn(t testing.TB, cmd []string) time.Duration {
	t0 := time.Now()
	argv := agentArgv(cmd)
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdin = strings.NewReader("hi")
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.Start())
	br := bufio.NewReader(out)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	d := time.Since(t0)
	_, _ = io.Copy(io.Discard, br)
	require.NoError(t, c.Wait())
	return d
}

// latency measures publish-to-first-line at a subscriber (idle worker),
// each job right after one bare spawn of the same agent (the baseline,
// interleaved so both see the same machine), and agent-write-to-subscriber
// for single lines, on the fleet as processes.
func latency(t testing.TB, sz sizes) (p50, p99, bare50, bare99, lineP99 float64) {
	cmd := standin(t)
	f := startFleetProcs(t, 1, "file")
	done, stop := terminalWatcher(t, f.nc, f.names)
	defer stop()
	sub, err := f.nc.SubscribeSync(f.names.Prefix() + ".query.default.*.msg")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	var first, bare []time.Duration
	// The first few jobs of a fresh fleet are slower (new stream files,
	// cold caches in three new processes; up to ~150 ms): both sides warm
	// up untimed, and the figures are the steady state.
	const warmUp = 5
	for i := range warmUp + sz.firstLineJobs {
		b := bareSpawn(t, cmd)
		if i >= warmUp {
			bare = append(bare, b)
		}
		id := "fl" + strconv.Itoa(i)
		t0 := time.Now()
		f.submit(t, "default", id, "hi")
		for {
			m, err := sub.NextMsg(time.Minute)
			require.NoError(t, err)
			if strings.Contains(m.Subject, "."+id+".") && m.Header.Get(protocol.HeaderSeq) == "1" {
				if i >= warmUp {
					first = append(first, time.Since(t0))
				}
				break
			}
		}
		waitTerminal(t, done, 1, time.Minute) // idle again before the next
	}
	p50, p99 = percentile(first, 0.50), percentile(first, 0.99)
	bare50, bare99 = percentile(bare, 0.50), percentile(bare, 0.99)

	stamp := regexp.MustCompile(` t=(\d+)`)
	lsub, err := f.nc.SubscribeSync(f.names.QueryMsg("default", "lat-1"))
	require.NoError(t, err)
	defer lsub.Unsubscribe()
	f.submit(t, "default", "lat-1", fmt.Sprintf("/standin lines=%d delay=1ms stamp=1", sz.latencyLines))
	var lines []time.Duration
	for len(lines) < sz.latencyLines {
		m, err := lsub.NextMsg(time.Minute)
		require.NoError(t, err)
		if s := stamp.FindSubmatch(m.Data); s != nil {
			ns, _ := strconv.ParseInt(string(s[1]), 10, 64)
			lines = append(lines, time.Since(time.Unix(0, ns)))
		}
	}
	return p50, p99, bare50, bare99, percentile(lines, 0.99)
}

func build(t testing.TB, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(strings.TrimSuffix(pkg, "/v2")))
	c := exec.Command("go", "build", "-o", out, pkg)
	c.Dir = "../.."
	c.Stderr = os.Stderr
	require.NoError(t, c.Run(), "go build %s", pkg)
	return out
}

func rssMB(t testing.TB, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// steadyRSS samples a process's RSS until it stops growing.
func steadyRSS(t testing.TB, pid int) float64 {
	last := rssMB(t, pid)
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		cur := rssMB(t, pid)
		if cur <= last+0.05 {
			return max(cur, last)
		}
		last = cur
	}
	return last
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// rss measures the worker binary's idle RSS beside a bare nats.go client,
// and its growth while jobs are queued (workers hold no backlog).
func rss(t testing.TB, sz sizes) (idle, base, delta float64) {
	dir := t.TempDir()
	workerBin := build(t, dir, "./cmd/worker")
	agentBin := build(t, dir, "./cmd/fleet-standin-agent")
	bareBin := build(t, dir, "./internal/bench/bareclient")
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()

	bare := exec.Command(bareBin, url)
	out, err := bare.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, bare.Start())
	defer func() { _ = bare.Process.Kill(); _ = bare.Wait() }()
	_, err = bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	base = steadyRSS(t, bare.Process.Pid)

	wk := startWorker(t, workerBin, agentBin, dir, url, "file://"+filepath.Join(dir, "data"), 1, nil)
	defer func() { _ = wk.Process.Kill(); <-wk.exited }()
	idle = steadyRSS(t, wk.Process.Pid)

	// Occupy the worker's only slot, then queue many jobs behind it.
	sub, err := f.NC.SubscribeSync(f.Names.QueryMsg("default", "hold"))
	require.NoError(t, err)
	f.SubmitJSON("default", "hold", "/standin sleep=1h")
	_, err = sub.NextMsg(time.Minute)
	require.NoError(t, err)
	before := steadyRSS(t, wk.Process.Pid)
	for i := range sz.queuedJobs {
		f.SubmitJSON("default", "queued-"+strconv.Itoa(i), "hi")
	}
	after := steadyRSS(t, wk.Process.Pid)
	return idle, base, after - before
}

func BenchmarkFleet(b *testing.B) {
	b.Run("relay", func(b *testing.B) {
		sz := full
		envInt(b, "BENCH_RELAY_LINES", &sz.relayLines, 1)
		envInt(b, "BENCH_RELAY_ROUNDS", &sz.relayRounds, 1)
		r := relay(b, sz)
		fmt.Printf("# relay: %d lines of 1 KiB in %d rounds; fleet/baseline by round:", r.lines, len(r.roundRatios))
		for _, x := range r.roundRatios {
			fmt.Printf(" %.3f", x)
		}
		fmt.Println()
		figure("relay_lines_per_s", r.fleet.rate(), "lines/s")
		figure("relay_baseline_lines_per_s", r.base.rate(), "lines/s")
		figure("relay_ratio", r.fleet.rate()/r.base.rate(), "ratio")
		figure("relay_fenced_baseline_lines_per_s", r.fenced.rate(), "lines/s")
		figure("relay_fenced_baseline_ratio", r.fenced.rate()/r.base.rate(), "ratio")
		figure("relay_to_fenced_baseline_ratio", r.fleet.rate()/r.fenced.rate(), "ratio")
		figure("relay_fleet_cpu_us_per_line", r.fleet.usPerLine(r.fleet.cpu), "us")
		figure("relay_baseline_cpu_us_per_line", r.base.usPerLine(r.base.cpu), "us")
		figure("relay_fenced_baseline_cpu_us_per_line", r.fenced.usPerLine(r.fenced.cpu), "us")
		figure("relay_worker_cpu_us_per_line", r.fleet.usPerLine(r.fleetProcs.worker), "us")
		figure("relay_dispatcher_cpu_us_per_line", r.fleet.usPerLine(r.fleetProcs.dispatcher), "us")
		figure("relay_nats_cpu_us_per_line", r.fleet.usPerLine(r.fleet.nats), "us")
		figure("relay_baseline_nats_cpu_us_per_line", r.base.usPerLine(r.base.nats), "us")
		figure("relay_fenced_baseline_nats_cpu_us_per_line", r.fenced.usPerLine(r.fenced.nats), "us")
		figure("relay_archive_lines_per_s", r.archive.rate(), "lines/s")
		figure("relay_archive_cpu_us_per_line", r.archive.usPerLine(r.archive.cpu), "us")
		b.ReportMetric(r.fleet.rate()/r.base.rate(), "relay_ratio")
	})
	b.Run("dispatch", func(b *testing.B) {
		d := shapeFromEnv(b, full.dispatchJobs)
		r := dispatch(b, d)
		fmt.Printf("# dispatch: %d jobs, %d slots, %d lines per job (0 = the 3-line echo), %s storage\n", d.jobs, d.slots, d.lines, d.storage)
		figure("dispatch_jobs_per_s", r.fleetRate, "jobs/s")
		figure("dispatch_baseline_jobs_per_s", r.baseRate, "jobs/s")
		figure("dispatch_ratio", r.fleetRate/r.baseRate, "ratio")
		printAsynq(r)
		figure("fleet_cpu_ms_per_job", r.fleetCPUms(), "ms")
		figure("worker_cpu_ms_per_job", perJob(r.cpu.worker, r.jobs), "ms")
		figure("dispatcher_cpu_ms_per_job", perJob(r.cpu.dispatcher, r.jobs), "ms")
		figure("nats_cpu_ms_per_job", perJob(r.cpu.nats, r.jobs), "ms")
		figure("baseline_spawn_cpu_ms_per_job", perJob(r.baseCPU, r.jobs), "ms")
		figure("harness_cpu_ms_per_job", perJob(r.harness, r.jobs), "ms")
		figure("nats_msgs_in_per_job", float64(r.natsIn)/float64(r.jobs), "msgs")
		figure("nats_msgs_out_per_job", float64(r.natsOut)/float64(r.jobs), "msgs")
		figure("nats_subs_per_job", float64(r.natsSubs)/float64(r.jobs), "subs")
		figure("host_file_create_cpu_us_before", r.createUS[0], "us")
		figure("host_file_create_cpu_us_after", r.createUS[1], "us")
		figure("floor_cpu_ms_per_job", perJob(r.floor.nats+r.floor.client, r.floor.jobs), "ms")
		figure("floor_nats_cpu_ms_per_job", perJob(r.floor.nats, r.floor.jobs), "ms")
		figure("floor_client_cpu_ms_per_job", perJob(r.floor.client, r.floor.jobs), "ms")
		figure("floor_nats_msgs_per_job", float64(r.floor.natsIn+r.floor.natsOut)/float64(r.floor.jobs), "msgs")
		figure("floor_to_fleet_cpu_ratio", perJob(r.floor.nats+r.floor.client, r.floor.jobs)/r.fleetCPUms(), "ratio")
		b.ReportMetric(r.fleetRate/r.baseRate, "dispatch_ratio")
	})
	b.Run("latency", func(b *testing.B) {
		p50, p99, bare50, bare99, lineP99 := latency(b, full)
		figure("first_line_p50_ms", p50, "ms")
		figure("first_line_p99_ms", p99, "ms")
		figure("first_line_bare_p50_ms", bare50, "ms")
		figure("first_line_bare_p99_ms", bare99, "ms")
		figure("first_line_p99_over_bare_ms", p99-bare99, "ms")
		figure("line_p99_ms", lineP99, "ms")
	})
	b.Run("workspace", func(b *testing.B) {
		clone, fleet, capture, base := checkoutAndCapture(b, fullWS)
		fmt.Printf("# workspace: %d files of ~%d KiB over %d commits, medians of %d runs; capture of %d new files\n",
			fullWS.files, fullWS.fileBytes>>10, fullWS.commits, fullWS.rounds, fullWS.changed)
		figure("checkout_clone_baseline_ms", clone, "ms")
		figure("checkout_fleet_ms", fleet, "ms")
		figure("checkout_ratio", clone/fleet, "ratio")
		figure("capture_ms", capture, "ms")
		figure("capture_baseline_ms", base, "ms")
		figure("capture_ratio", base/capture, "ratio")
	})
	b.Run("rss", func(b *testing.B) {
		idle, base, delta := rss(b, full)
		figure("idle_rss_mb", idle, "MB")
		figure("baseline_client_rss_mb", base, "MB")
		figure("idle_rss_ratio", idle/base, "ratio")
		figure("queued_rss_delta_mb", delta, "MB")
	})
}

// TestBenchmarksRun runs every benchmark at a tiny size so they cannot rot.
// It asserts that they complete and produce sane figures, never their speed.
func TestBenchmarksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole fleet several times; skipped with -short")
	}
	tiny := sizes{relayLines: 500, relayRounds: 2, dispatchJobs: 16, firstLineJobs: 3, latencyLines: 20, queuedJobs: 50}
	rr := relay(t, tiny)
	require.Positive(t, rr.fleet.rate())
	require.Positive(t, rr.base.rate())
	require.Positive(t, rr.fenced.rate())
	require.Len(t, rr.roundRatios, tiny.relayRounds)
	for _, us := range serverShare(t, 1, 20) {
		require.Positive(t, us)
	}
	r := dispatch(t, dispatchShape{jobs: tiny.dispatchJobs, slots: 4})
	require.Positive(t, r.fleetRate)
	require.Positive(t, r.floor.natsIn, "the floor's jobs went through the server")
	require.Positive(t, r.baseRate)
	require.Positive(t, r.fleetCPUms())
	r = dispatch(t, dispatchShape{jobs: 4, slots: 2, lines: 50})
	require.Positive(t, r.fleetRate)
	p50, p99, b50, b99, l99 := latency(t, tiny)
	require.Positive(t, b50)
	require.GreaterOrEqual(t, b99, b50)
	require.Positive(t, p50)
	require.GreaterOrEqual(t, p99, p50)
	require.GreaterOrEqual(t, l99, 0.0)
}
