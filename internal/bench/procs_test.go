package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// fleetProcs is the fleet as it runs in production: a nats-server, a
// dispatcher and a worker, each its own process built from this tree, so
// each one's CPU can be read from /proc/<pid>/stat, apart from the
// harness that submits jobs and watches their statuses.
type fleetProcs struct {
	nats, dispatcher, worker *proc
	// natsPeers are a cluster's other nodes, workers every worker
	// (worker is the first): make bench/fleet's shapes (fleetOpts).
	natsPeers, workers     []*proc
	nc                     *nats.Conn
	js                     jetstream.JetStream
	names                  protocol.Names
	workerPprof, dispPprof string
	natsProfile            string
	natsMonitor            string
	dataDir                string // the file:// storage of dispatcher and worker (if not nats://)
}

type binaries struct{ nats, dispatcher, worker, agent string }

// buildBins builds the four binaries into a directory of t (the build
// cache makes the second build a link).
func buildBins(t testing.TB) binaries {
	dir := t.TempDir()
	return binaries{
		nats:       build(t, dir, "github.com/nats-io/nats-server/v2"),
		dispatcher: build(t, dir, "./cmd/dispatcher"),
		worker:     build(t, dir, "./cmd/worker"),
		agent:      build(t, dir, "./cmd/fleet-standin-agent"),
	}
}

// proc is a child process of the harness, watched from its start, so a
// wait for it to be ready ends as soon as it exits, with its log's tail.
type proc struct {
	*exec.Cmd
	name, log string
	exited    chan struct{} // closed once the process has exited
	err       error         // its Wait error, once exited is closed
}

// startProc starts bin with args, its output in the file log; it is
// interrupted (killed after 30 s) when t ends.
func startProc(t testing.TB, name, log string, bin string, args ...string) *proc {
	c := exec.Command(bin, args...)
	f, err := os.Create(log)
	require.NoError(t, err)
	c.Stdout, c.Stderr = f, f
	c.Env = append(os.Environ(), "FLEET_LOG_LEVEL=warn", "FLEET_LOG_FORMAT=json")
	// Killed with the benchmark, whatever ends it.
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, c.Start(), name)
	p := &proc{Cmd: c, name: name, log: log, exited: make(chan struct{})}
	go func() { p.err = c.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop()
		_ = f.Close()
	})
	return p
}

// stop interrupts p and waits until it has exited (killing it after 30 s).
func (p *proc) stop() {
	_ = p.Process.Signal(os.Interrupt)
	waitOrKill(p.Process, p.exited)
}

// waitOrKill waits until exited is closed, killing process after 30 s.
func waitOrKill(process *os.Process, exited <-chan struct{}) {
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = process.Kill()
		<-exited
	}
}

// errExited is waitReady's error for a process that exited first.
var errExited = errors.New("exited before it was ready")

// waitReady polls ready every 50 ms for up to a minute. It returns
// errExited (wrapped, with the exit status and the log's tail) as soon
// as p exits, and fails t if the minute passes, with the log's tail.
func (p *proc) waitReady(t testing.TB, ready func() bool) error {
	t.Helper()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("%s %w (%v); its log ends:\n%s", p.name, errExited, p.err, p.logTail()) //nolint:errorlint // p.err is nil after a clean exit; it is shown, not matched
		default:
		}
		if ready() {
			return nil
		}
		select {
		case <-p.exited:
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s not ready in a minute; its log ends:\n%s", p.name, p.logTail())
		}
	}
}

// logTail is the last 2 KiB of p's log.
func (p *proc) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return string(b[max(0, len(b)-2048):])
}

// startServing starts a process that serves HTTP on ports the harness
// picked (args makes its arguments from fresh ones each time) and waits
// until ready says it is. Picked ports are free when picked, not when the
// process binds them: another process may take one in between, so a
// process that exits on an address in use is started again, up to three
// times.
func startServing(t testing.TB, name, log, bin string, args func() []string, ready func() bool) *proc {
	t.Helper()
	for try := 1; ; try++ {
		p := startProc(t, name, log, bin, args()...)
		err := p.waitReady(t, ready)
		if err == nil {
			return p
		}
		if try == 3 || !strings.Contains(p.logTail(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("%s: a port was taken before it bound it; starting it again", name)
	}
}

// client bounds every request the harness makes.
var client = &http.Client{Timeout: 5 * time.Second}

// startWorker starts the worker binary on url with storeURL, slots slots,
// agent as its agent and its directories and log under dir, and
// waits until it is ready. Its agents run with --isolation none: the
// baselines spawn the same program directly, so a contained worker would
// be measured against less work (bwrap's namespaces cost 6–18 ms per
// start here; BenchmarkContainedFirstLine in pkg/sandbox measures that
// beside a plain spawn). With pprof non-nil it also serves profiles, on
// the address it sets *pprof to.
func startWorker(t testing.TB, bin, agent, dir, url, storeURL string, slots int, pprof *string) *proc {
	var httpAddr string
	return startServing(t, "worker", filepath.Join(dir, "worker.log"), bin, func() []string {
		httpAddr = freePort(t)
		args := []string{"--nats-url", url, "--storage", storeURL,
			"--journal-dir", filepath.Join(dir, "journal"), "--sandbox-dir", filepath.Join(dir, "sb"),
			"--agent-cmd", agent, "--slots", strconv.Itoa(slots), "--http", httpAddr,
			"--isolation", "none"}
		if pprof != nil {
			*pprof = freePort(t)
			args = append(args, "--pprof", *pprof)
		}
		return args
	}, func() bool { return httpOK("http://" + httpAddr + "/readyz") })
}

// natsPorts is the part of nats-server's ports file the harness reads.
type natsPorts struct {
	Nats       []string `json:"nats"`
	Monitoring []string `json:"monitoring"`
	Profile    []string `json:"profile"`
}

// readPorts reads a ports file; ok is false until it is written whole.
func readPorts(t testing.TB, path string) (p natsPorts, ok bool) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return p, false
	}
	require.NoError(t, err)
	if json.Unmarshal(b, &p) != nil || len(p.Nats) == 0 || len(p.Monitoring) == 0 {
		return p, false
	}
	return p, true
}

// httpOK reports whether a GET of url answers 200.
func httpOK(url string) bool {
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startFleetProcs starts the three processes with slots worker slots and
// storage ("file", in dataDir, or "nats": the server's KV and Object Store)
// and waits until the worker is ready.
func startFleetProcs(t testing.TB, slots int, storage string) *fleetProcs {
	return startFleet(t, slots, storage, fleetOpts{})
}

// fleetOpts shape the fleet beyond its slots and storage (make bench/fleet).
type fleetOpts struct {
	workers int  // worker processes, each with the slots; 0 is 1
	cluster bool // three nats-server nodes, the streams R3 (--replicas 3)
}

// startFleet is startFleetProcs with o.workers workers and, with
// o.cluster, a 3-node cluster (startNATSCluster) instead of one server.
func startFleet(t testing.TB, slots int, storage string, o fleetOpts) *fleetProcs {
	bins := buildBins(t)
	dir := t.TempDir()
	fp := &fleetProcs{names: protocol.NewNames("")}
	profiling := os.Getenv("BENCH_PROFILE_DIR") != ""
	if o.cluster {
		return startFleetOn(t, fp, bins, dir, startNATSCluster(t, fp, bins.nats, dir), slots, storage, o, profiling)
	}
	// nats-server picks its own ports and writes them to a file, so no
	// other process can take one between the harness's pick and its bind.
	portsDir := filepath.Join(dir, "ports")
	require.NoError(t, os.Mkdir(portsDir, 0o755))
	natsArgs := []string{"-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir", portsDir,
		"-js", "-sd", filepath.Join(dir, "nats")}
	if profiling {
		natsArgs = append(natsArgs, "--profile", "-1")
	}
	fp.nats = startProc(t, "nats-server", filepath.Join(dir, "nats.log"), bins.nats, natsArgs...)
	var url string
	require.NoError(t, fp.nats.waitReady(t, func() bool {
		if url == "" {
			ports, ok := readPorts(t, filepath.Join(portsDir, fmt.Sprintf("nats-server_%d.ports", fp.nats.Process.Pid)))
			if !ok || (profiling && len(ports.Profile) == 0) {
				return false
			}
			url, fp.natsMonitor = ports.Nats[0], strings.TrimPrefix(ports.Monitoring[0], "http://")
			if profiling {
				fp.natsProfile = strings.TrimPrefix(ports.Profile[0], "http://")
			}
		}
		nc, err := nats.Connect(url)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	}))
	return startFleetOn(t, fp, bins, dir, url, slots, storage, o, profiling)
}

// startFleetOn starts the dispatcher and o.workers workers on the
// server(s) at url (comma-separated on a cluster).
func startFleetOn(t testing.TB, fp *fleetProcs, bins binaries, dir, url string, slots int, storage string, o fleetOpts, profiling bool) *fleetProcs {
	fp.dataDir = filepath.Join(dir, "data")
	storeURL := "file://" + fp.dataDir
	if storage == "nats" {
		storeURL = "nats://"
		require.NoError(t, os.Mkdir(fp.dataDir, 0o755)) // for fileCreateCPU
	}
	var dispHTTP string
	fp.dispatcher = startServing(t, "dispatcher", filepath.Join(dir, "dispatcher.log"), bins.dispatcher, func() []string {
		dispHTTP = freePort(t)
		dargs := []string{"serve", "--nats-url", url, "--storage", storeURL, "--http", dispHTTP,
			"--max-concurrency", strconv.Itoa(max(64, slots*max(1, o.workers)))}
		if o.cluster {
			dargs = append(dargs, "--replicas", "3")
		}
		if profiling {
			fp.dispPprof = freePort(t)
			dargs = append(dargs, "--pprof", fp.dispPprof)
		}
		return dargs
	}, func() bool { return httpOK("http://" + dispHTTP + "/readyz") })

	var pprof *string
	if profiling {
		pprof = &fp.workerPprof
	}
	fp.worker = startWorker(t, bins.worker, bins.agent, dir, url, storeURL, slots, pprof)
	fp.workers = []*proc{fp.worker}
	for i := 1; i < o.workers; i++ {
		wdir := filepath.Join(dir, "worker-"+strconv.Itoa(i))
		require.NoError(t, os.Mkdir(wdir, 0o755))
		fp.workers = append(fp.workers, startWorker(t, bins.worker, bins.agent, wdir, url, storeURL, slots, nil))
	}

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	fp.nc, fp.js = nc, js
	return fp
}

// procCPU is a process's own user+system CPU (fields 14 and 15 of
// /proc/<pid>/stat, in clock ticks of 10 ms; children are not counted).
func procCPU(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	rest := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err := strconv.ParseInt(rest[11], 10, 64)
	require.NoError(t, err)
	stime, err := strconv.ParseInt(rest[12], 10, 64)
	require.NoError(t, err)
	const tick = 10 * time.Millisecond // sysconf(_SC_CLK_TCK) is 100 on Linux
	return time.Duration(utime+stime) * tick
}

type cpuSample struct{ nats, dispatcher, worker time.Duration }

// cpu is the fleet's CPU so far by kind of process: every nats-server
// node and every worker summed.
func (fp *fleetProcs) cpu(t testing.TB) cpuSample {
	s := cpuSample{
		nats:       procCPU(t, fp.nats.Process.Pid),
		dispatcher: procCPU(t, fp.dispatcher.Process.Pid),
		worker:     procCPU(t, fp.worker.Process.Pid),
	}
	for _, p := range fp.natsPeers {
		s.nats += procCPU(t, p.Process.Pid)
	}
	for _, p := range fp.workers[min(1, len(fp.workers)):] {
		s.worker += procCPU(t, p.Process.Pid)
	}
	return s
}

// submit publishes a job the way a producer does (JetStream publish with
// Nats-Msg-Id).
func (fp *fleetProcs) submit(t testing.TB, tenant, id, prompt string) {
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt})
	require.NoError(t, err)
	m := nats.NewMsg(fp.names.JobSubject(tenant))
	m.Data = b
	m.Header.Set(protocol.HeaderMsgID, id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = fp.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// settle waits until the fleet's processes are quiet (under 5% of a core
// over 200 ms, up to 10 s), so that one measurement does not pay for the
// work another left behind: a deleted stream's files, an archiver still
// reading a transcript back.
func (fp *fleetProcs) settle(t testing.TB) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c0 := fp.cpu(t)
		time.Sleep(200 * time.Millisecond)
		c1 := fp.cpu(t)
		if c1.nats-c0.nats+c1.dispatcher-c0.dispatcher+c1.worker-c0.worker <= 10*time.Millisecond {
			return
		}
	}
	t.Logf("the fleet did not quiet down in 10 s; measuring anyway")
}

// profile, when BENCH_PROFILE_DIR is set, takes CPU profiles of the three
// processes for the given time, or BENCH_PROFILE_SECONDS (to see where a
// figure comes from); it returns a function that waits for them.
func (fp *fleetProcs) profile(t testing.TB, prefix string, d time.Duration) func() {
	dir := os.Getenv("BENCH_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	secs := max(1, int(d.Seconds()))
	envInt(t, "BENCH_PROFILE_SECONDS", &secs, 1)
	var wg sync.WaitGroup
	for name, addr := range map[string]string{"worker": fp.workerPprof, "dispatcher": fp.dispPprof, "nats": fp.natsProfile} {
		wg.Go(func() {
			resp, err := (&http.Client{Timeout: time.Duration(secs)*time.Second + time.Minute}).Get("http://" + addr + "/debug/pprof/profile?seconds=" + strconv.Itoa(secs))
			if err != nil {
				t.Logf("profile %s: %v", name, err)
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(filepath.Join(dir, prefix+name+".prof"))
			if err != nil {
				t.Logf("profile %s: %v", name, err)
				return
			}
			_, _ = io.Copy(f, resp.Body)
			_ = f.Close()
		})
	}
	return wg.Wait
}

// natsMsgs is the server's count of messages in and out so far (/varz).
func (fp *fleetProcs) natsMsgs(t testing.TB) (in, out int64) {
	resp, err := client.Get("http://" + fp.natsMonitor + "/varz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var v struct {
		InMsgs  int64 `json:"in_msgs"`
		OutMsgs int64 `json:"out_msgs"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v.InMsgs, v.OutMsgs
}

// natsSubInserts is how many subscriptions the server has added so far
// (/subsz): per job, it shows SUB/UNSUB churn.
func (fp *fleetProcs) natsSubInserts(t testing.TB) int64 {
	resp, err := client.Get("http://" + fp.natsMonitor + "/subsz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var v struct {
		Inserts int64 `json:"num_inserts"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v.Inserts
}
