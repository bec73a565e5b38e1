//go:build containers

package containertest

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestFleetInContainers runs the whole fleet in containers, in order: the
// bad starts, the probes from a contained agent (one worker, so two runs
// share it), jobs through NATS creds and /v1, then a second worker, a
// SIGKILL mid-job and a SIGTERM drain.
func TestFleetInContainers(t *testing.T) {
	f := newFleet(t)
	f.auth()
	f.startControl()
	w1, w2 := f.name+"-w1", f.name+"-w2"

	t.Run("bad starts exit at once naming the cause", f.badStarts)
	f.startWorker(w1)
	t.Run("a contained agent reaches none of the worker's files", func(t *testing.T) { f.probes(t, w1) })
	t.Run("a tenant's jobs through NATS creds and /v1", f.tenantJobs)
	f.startWorker(w2)
	var survivor string
	t.Run("SIGKILL mid-job: the job ends once, on the other worker", func(t *testing.T) { survivor = f.killMidJob(t, w1, w2) })
	if survivor != "" {
		t.Run("SIGTERM drains: the running job ends, the worker exits 0", func(t *testing.T) { f.drain(t, survivor) })
	}
}

// killMidJob kills the worker running a job with SIGKILL as soon as the job
// is running; the job is redelivered to the other worker and ends once.
// It returns the surviving worker.
func (f *fleet) killMidJob(t *testing.T, w1, w2 string) string {
	f.submit("kill-1", "/standin lines=2 sleep=20s")
	var killed string // the container
	ev := f.events(t, "kill-1", func(st protocol.StatusEvent) {
		if killed == "" && st.State == protocol.StateRunning && st.Worker != "" {
			killed = container(st.Worker, w1, w2)
			if killed == "" {
				t.Fatalf("kill-1 runs on %q, not on %s or %s", st.Worker, w1, w2)
			}
			f.podman("kill", "-s", "KILL", killed)
		}
	})
	if killed == "" {
		t.Fatalf("kill-1 never ran: %+v", ev.last)
	}
	if ev.terminals != 1 || ev.results != 1 || ev.last.State != protocol.StateSucceeded {
		t.Errorf("kill-1: %d terminal statuses, %d results, last %+v; want 1, 1, succeeded", ev.terminals, ev.results, ev.last)
	}
	if container(ev.last.Worker, w1, w2) == killed || ev.last.Attempt < 2 {
		t.Errorf("kill-1 ended on %q attempt %d; want the other worker, attempt 2 or more", ev.last.Worker, ev.last.Attempt)
	}
	if killed == w1 {
		return w2
	}
	return w1
}

// drain stops the worker with SIGTERM while it runs a job: the job ends
// (succeeded, first attempt, on it) and the worker exits 0.
func (f *fleet) drain(t *testing.T, worker string) {
	f.submit("drain-1", "/standin lines=2 sleep=5s")
	stopped := make(chan error, 1)
	var stopping bool
	ev := f.events(t, "drain-1", func(st protocol.StatusEvent) {
		if !stopping && st.State == protocol.StateRunning && container(st.Worker, worker) == worker {
			stopping = true
			go func() { stopped <- exec.Command("podman", "stop", "-t", "90", worker).Run() }()
		}
	})
	if ev.last.State != protocol.StateSucceeded || container(ev.last.Worker, worker) != worker || ev.last.Attempt != 1 || ev.terminals != 1 {
		t.Errorf("drain-1: last %+v, %d terminal statuses; want succeeded on %s, attempt 1, once", ev.last, ev.terminals, worker)
	}
	if !stopping {
		t.Fatalf("drain-1 never ran on %s: %+v", worker, ev.last)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("podman stop %s: %v", worker, err)
	}
	if code := f.podman("inspect", "-f", "{{.State.ExitCode}}", worker); code != "0" {
		t.Errorf("%s exited %s after SIGTERM, want 0:\n%s", worker, code, f.podman("logs", "--tail", "20", worker))
	}
}

// badStarts: no creds, a tenant's creds instead of the worker's, and no
// unmask (bubblewrap cannot mount /proc): each exits non-zero on its own,
// its output naming what is wrong.
func (f *fleet) badStarts(t *testing.T) {
	cases := []struct {
		name, creds string
		unmask      bool
		want        []string
	}{
		{"nocreds", "", true, []string{"/run/fleet/worker.creds"}},
		{"tenantcreds", filepath.Join(f.dir, "tenant-as-worker.creds"), true, []string{"creds"}},
		{"nounmask", filepath.Join(f.dir, "worker.creds"), false, []string{"bwrap", "contained"}},
	}
	for _, c := range cases {
		code, out := f.exited(f.name+"-bad-"+c.name, c.creds, c.unmask)
		if code == -1 {
			continue
		}
		if code == 0 {
			t.Errorf("%s: exit 0, want non-zero:\n%s", c.name, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: exit %d, output does not name %q:\n%s", c.name, code, w, out)
			}
		}
	}
}

// probes: run A writes a file in its own work directory and stays; run B,
// on the same worker, tries A's file, the worker's creds and data, writes
// /tmp, and dumps its environment.
func (f *fleet) probes(t *testing.T, worker string) {
	f.submit("probe-a", "/standin append=secret-a.txt dumpenv=1 sleep=10m")
	env := f.tailUntil("probe-a", "HOME=")
	home := between(between(env, "HOME=", `\n`), "", `"`)
	if !strings.HasPrefix(home, "/data/sandboxes/") || !strings.HasSuffix(home, "/home") {
		t.Fatalf("probe-a's HOME is %q, want /data/sandboxes/…/home: %s", home, env)
	}
	secretA := strings.TrimSuffix(home, "/home") + "/work/secret-a.txt"
	// The worker itself sees A's file: the probe below is not vacuous.
	if out := f.podman("exec", worker, "cat", secretA); out != "stand-in edit" {
		t.Fatalf("the worker reads %s as %q", secretA, out)
	}
	f.podman("exec", worker, "test", "-r", "/run/fleet/worker.creds")
	targets := []string{secretA, "/run/fleet/worker.creds", "/data/journal"}
	prompt := "/standin"
	for _, p := range targets {
		prompt += " cat=" + p
	}
	prompt += " append=/tmp/probe.txt cat=/tmp/probe.txt dumpenv=1"
	f.submit("probe-b", prompt)
	out := f.tail("probe-b")
	for _, p := range targets {
		if !strings.Contains(out, "[stand-in agent] cat "+p+": ") {
			t.Errorf("a contained agent could read %s (or did not try):\n%s", p, out)
		}
	}
	if !strings.Contains(out, `[stand-in agent] cat /tmp/probe.txt:\nstand-in edit`) {
		t.Errorf("/tmp is not writable in a contained agent:\n%s", out)
	}
	for _, leak := range []string{"BEGIN NATS USER JWT", "NKEY SEED", "FLEET_NATS"} {
		if strings.Contains(out, leak) {
			t.Errorf("probe-b's transcript holds %q:\n%s", leak, out)
		}
	}
	f.run(f.cli, f.cliArgs("cancel", "probe-a")...)
}

// container is the container (one of names) whose worker has the id id:
// a worker's id is its hostname, the container's name, and a suffix.
func container(id string, names ...string) string {
	for _, n := range names {
		if strings.HasPrefix(id, n+"-") {
			return n
		}
	}
	return ""
}

// between returns what follows start in s up to end (or the end of s).
func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	s = s[i+len(start):]
	if j := strings.Index(s, end); j >= 0 {
		s = s[:j]
	}
	return s
}

// tenantJobs: one job through NATS with acme's creds (the CLI), one through
// /v1 with acme's token; both succeed and are acme's.
func (f *fleet) tenantJobs(t *testing.T) {
	f.submit("nats-1", "/standin lines=3")
	out := f.tail("nats-1")
	if !strings.Contains(out, `"type":"result"`) {
		t.Errorf("nats-1 has no result:\n%s", out)
	}
	if st := f.status(t, "nats-1"); st.State != protocol.StateSucceeded || st.Tenant != "acme" {
		t.Errorf("nats-1: %+v", st)
	}
	body := `{"id":"http-1","prompt":"/standin lines=2"}`
	resp := f.http(t, http.MethodPost, "/v1/queries", body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/queries: %s", resp.Status)
	}
	ev := f.events(t, "http-1")
	if ev.results != 1 || ev.last.State != protocol.StateSucceeded || ev.last.Tenant != "acme" {
		t.Errorf("http-1: %d results, last status %+v", ev.results, ev.last)
	}
}

func (f *fleet) http(t *testing.T, method, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, f.httpURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (f *fleet) status(t *testing.T, id string) protocol.StatusEvent {
	t.Helper()
	resp := f.http(t, http.MethodGet, "/v1/queries/"+id, "")
	defer resp.Body.Close()
	var st protocol.StatusEvent
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET /v1/queries/%s: %s: %v", id, resp.Status, err)
	}
	return st
}

// eventsSeen is what a query's /v1 event stream held, to its end.
type eventsSeen struct {
	results   int // result lines the agent wrote
	terminals int // terminal statuses
	statuses  []protocol.StatusEvent
	last      protocol.StatusEvent
}

// events reads a query's /v1 event stream to its end; onStatus (when not
// nil) sees each status as it comes.
func (f *fleet) events(t *testing.T, id string, onStatus ...func(protocol.StatusEvent)) eventsSeen {
	t.Helper()
	resp := f.http(t, http.MethodGet, "/v1/queries/"+id+"/events", "")
	defer resp.Body.Close()
	var seen eventsSeen
	var event string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "message":
			if strings.HasPrefix(strings.TrimPrefix(line, "data: "), `{"type":"result"`) {
				seen.results++
			}
		case strings.HasPrefix(line, "data: ") && event == "status":
			var st protocol.StatusEvent
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &st); err != nil {
				t.Fatalf("status event of %s: %v: %s", id, err, line)
			}
			seen.statuses = append(seen.statuses, st)
			seen.last = st
			if st.State.Terminal() {
				seen.terminals++
			}
			for _, fn := range onStatus {
				fn(st)
			}
		}
	}
	return seen
}
