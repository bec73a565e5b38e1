package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// asynqSkipped is the line make bench prints instead of the asynq
// baseline's figures where redis-server is not installed.
const asynqSkipped = "# asynq baseline skipped: redis-server not installed (apt-get install redis-server)"

// asynqResult is the asynq baseline's run: the dispatch workload on asynq
// v0.26 and redis-server (internal/bench/asynqbase).
type asynqResult struct {
	ran              bool // false where redis-server is not installed
	jobs             int
	rate             float64
	program, redis   time.Duration // CPU over the run, from /proc
	completed, lines int           // tasks asynq completed, lines stored in Redis
}

func (r asynqResult) cpuMS() float64 { return perJob(r.program+r.redis, r.jobs) }

// asynqBaseline runs d's jobs (same count, prompt and concurrency as the
// fleet's slots) on asynq: a producer enqueues them, an asynq server with
// d.slots workers spawns argv (the fleet worker's argv for the stand-in)
// for each with the prompt on stdin and appends each stdout line to a
// Redis stream (XADD). Redis runs on loopback TCP, like the fleet's
// nats-server, with appendonly yes and appendfsync everysec. It measures
// jobs/s from the first enqueue until asynq counts every task completed,
// and the CPU of the asynq program and redis-server from /proc (the
// agents, their children, not counted, as the fleet's worker's are not).
func asynqBaseline(t testing.TB, d dispatchShape, argv []string) asynqResult {
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		return asynqResult{}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "asynqbase")
	c := exec.Command("go", "build", "-o", bin, ".")
	c.Dir = "asynqbase" // a module of its own: asynq stays out of the product's go.mod
	c.Env = append(os.Environ(), "GOWORK=off")
	c.Stderr = os.Stderr
	require.NoError(t, c.Run(), "go build internal/bench/asynqbase")
	rds, addr := startRedis(t, redisBin, dir)
	// Stopped once done: idle, it would still cost the fleet's run CPU.
	defer rds.stop()

	args := append([]string{"-redis", addr, "-jobs", strconv.Itoa(d.jobs), "-concurrency", strconv.Itoa(d.slots),
		"-prompt", d.prompt(), "--"}, argv...)
	prog := exec.Command(bin, args...)
	stdin, err := prog.StdinPipe()
	require.NoError(t, err)
	stdout, err := prog.StdoutPipe()
	require.NoError(t, err)
	logf, err := os.Create(filepath.Join(dir, "asynqbase.log"))
	require.NoError(t, err)
	defer logf.Close()
	prog.Stderr = logf
	prog.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, prog.Start())
	exited := make(chan struct{}) // closed once it has exited; its failures show in its output
	go func() { _ = prog.Wait(); close(exited) }()
	defer func() {
		_ = stdin.Close() // it ends at the end of its input
		waitOrKill(prog.Process, exited)
	}()
	out := bufio.NewScanner(stdout)
	expect := func(prefix string) string {
		t.Helper()
		if !out.Scan() {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("asynqbase ended before %q: %v; its log:\n%s", prefix, out.Err(), log)
		}
		rest, ok := strings.CutPrefix(out.Text(), prefix)
		require.True(t, ok, "asynqbase said %q, want %q", out.Text(), prefix)
		return rest
	}
	expect("ready")
	r := asynqResult{ran: true, jobs: d.jobs}
	p0, r0 := procCPU(t, prog.Process.Pid), procCPU(t, rds.Process.Pid)
	start := time.Now()
	_, err = io.WriteString(stdin, "go\n")
	require.NoError(t, err)
	expect("done ")
	r.rate = float64(d.jobs) / time.Since(start).Seconds()
	r.program, r.redis = procCPU(t, prog.Process.Pid)-p0, procCPU(t, rds.Process.Pid)-r0
	_, err = io.WriteString(stdin, "check\n")
	require.NoError(t, err)
	_, err = fmt.Sscanf(expect("ok "), "completed=%d lines=%d", &r.completed, &r.lines)
	require.NoError(t, err)
	return r
}

// startRedis starts redis-server on a loopback port, its files in dir,
// persisting as close to the fleet's JetStream file storage as Redis
// goes (an append-only file, fsynced every second), and waits until it
// answers. A port taken between the pick and the bind starts it again on
// another, up to three times.
func startRedis(t testing.TB, bin, dir string) (*proc, string) {
	for try := 1; ; try++ {
		addr := freePort(t)
		port := addr[strings.LastIndexByte(addr, ':')+1:]
		p := startProc(t, "redis-server", filepath.Join(dir, "redis-"+strconv.Itoa(try)+".log"), bin,
			"--bind", "127.0.0.1", "--port", port, "--dir", dir, "--save", "",
			"--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no")
		err := p.waitReady(t, func() bool { return redisPing(addr) })
		if err == nil {
			return p, addr
		}
		if try == 3 || !strings.Contains(strings.ToLower(p.logTail()), "address already in use") {
			t.Fatal(err)
		}
	}
}

// redisPing reports whether a Redis server at addr answers PING.
func redisPing(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

// printAsynq prints the asynq baseline's figures beside the fleet's
// dispatch (make bench), or the line saying why there are none.
func printAsynq(r dispatchResult) {
	a := r.asynq
	if !a.ran {
		fmt.Println(asynqSkipped)
		return
	}
	fmt.Printf("# asynq baseline: asynq v0.26.0 + redis-server (appendonly yes, appendfsync everysec), %d jobs, the same agent, argv, prompt and concurrency\n", a.jobs)
	figure("dispatch_asynq_jobs_per_s", a.rate, "jobs/s")
	figure("asynq_cpu_ms_per_job", a.cpuMS(), "ms")
	figure("asynq_program_cpu_ms_per_job", perJob(a.program, a.jobs), "ms")
	figure("asynq_redis_cpu_ms_per_job", perJob(a.redis, a.jobs), "ms")
	figure("dispatch_to_asynq_ratio", r.fleetRate/a.rate, "ratio")
	figure("fleet_to_asynq_cpu_ratio", r.fleetCPUms()/a.cpuMS(), "ratio")
}

// TestAsynqBaselineRuns runs the asynq baseline at a tiny size so it
// cannot rot: every task completed, every line stored, sane figures.
func TestAsynqBaselineRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the asynq baseline; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed: .ci/run does not install it, so CI skips the asynq baseline (apt-get install redis-server)")
	}
	d := dispatchShape{jobs: 24, slots: 4}
	r := asynqBaseline(t, d, agentArgv(standin(t)))
	require.True(t, r.ran)
	require.Equal(t, d.jobs, r.completed, "asynq ran every task")
	require.Equal(t, 3*d.jobs, r.lines, "the stand-in's three echo lines of every job in Redis")
	require.Positive(t, r.rate)
	require.GreaterOrEqual(t, r.cpuMS(), 0.0)
}
