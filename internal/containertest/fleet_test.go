//go:build containers

package containertest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Users of the images (Dockerfile): the worker, and the dispatcher and
// nats-server (one control-plane user sharing the auth directory).
const (
	workerUID  = 10001
	controlUID = 10002
)

// fleet is one test's containers, network and files.
type fleet struct {
	t       *testing.T
	tag     string // image tag
	name    string // prefix of every container and the network
	dir     string
	cli     string // the dispatcher binary, on the host
	natsIP  string // nats-server's address on the podman network
	natsURL string // its published port on loopback
	httpURL string // the dispatcher's /v1, published on loopback
	token   string // acme's bearer token
	creds   string // acme's NATS creds
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	tag := os.Getenv("FLEET_CONTAINER_TAG")
	if tag == "" {
		t.Skip("FLEET_CONTAINER_TAG is not set: run make test/containers")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (rootful podman)")
	}
	f := &fleet{t: t, tag: tag, name: fmt.Sprintf("afct%d", os.Getpid()), cli: filepath.Join(repoRoot(t), "bin", "image", "dispatcher")}
	dir, err := os.MkdirTemp("", "containertest")
	if err != nil {
		t.Fatal(err)
	}
	f.dir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.cleanup)
	return f
}

// cleanup removes every container of this test, their volumes, the network
// and the files; the images are removed by scripts/test-containers.sh.
func (f *fleet) cleanup() {
	out, _ := exec.Command("podman", "ps", "-a", "-q", "--filter", "name=^"+f.name).Output()
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command("podman", "rm", "-f", "-v", id).Run()
	}
	_ = exec.Command("podman", "network", "rm", "-f", f.name).Run()
	_ = os.RemoveAll(f.dir)
}

func (f *fleet) image(name string) string { return "localhost/agentfleet/" + name + ":" + f.tag }

// run runs a command and returns its stdout; it fails the test with
// stderr when the command fails.
func (f *fleet) run(name string, args ...string) string {
	f.t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		f.t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func (f *fleet) podman(args ...string) string { f.t.Helper(); return f.run("podman", args...) }

// auth makes the NATS JWT set-up (dispatcher auth init, as compose/auth
// does), a tenant acme with creds and a token, and gives each file to the
// user of the container that reads it: the auth directory to the control
// plane, a copy of worker.creds (0600) to the worker.
func (f *fleet) auth() {
	f.t.Helper()
	auth := filepath.Join(f.dir, "auth")
	f.run(f.cli, "auth", "init", "--dir", auth, "--resolver-dir", "/auth/jwt")
	f.creds = filepath.Join(f.dir, "acme.creds")
	f.run(f.cli, "tenant", "creds", "acme", "--dir", auth, "--out", f.creds)
	f.token = f.run(f.cli, "tenant", "token", "acme", "--dir", auth)
	conf := "listen: 0.0.0.0:4222\nhttp: 0.0.0.0:8222\njetstream { store_dir: /data/nats }\ninclude ./nats-auth.conf\n"
	f.writeOwned(filepath.Join(auth, "nats.conf"), []byte(conf), controlUID)
	f.run("chown", "-R", fmt.Sprint(controlUID)+":"+fmt.Sprint(controlUID), auth)
	wc, err := os.ReadFile(filepath.Join(auth, "worker.creds"))
	if err != nil {
		f.t.Fatal(err)
	}
	f.writeOwned(filepath.Join(f.dir, "worker.creds"), wc, workerUID)
	tc, err := os.ReadFile(f.creds)
	if err != nil {
		f.t.Fatal(err)
	}
	f.writeOwned(filepath.Join(f.dir, "tenant-as-worker.creds"), tc, workerUID)
}

func (f *fleet) writeOwned(path string, b []byte, uid int) {
	f.t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Chown(path, uid, uid); err != nil {
		f.t.Fatal(err)
	}
}

// publishedPort is the loopback port podman published for a container's port.
func (f *fleet) publishedPort(ctr, port string) string {
	f.t.Helper()
	out := f.podman("port", ctr, port)
	_, p, err := net.SplitHostPort(strings.Fields(out)[0])
	if err != nil {
		f.t.Fatalf("podman port %s %s: %q: %v", ctr, port, out, err)
	}
	return p
}

// waitListening dials addr until it answers (the container's process is up).
func (f *fleet) waitListening(addr string) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s does not answer: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startControl starts the network, nats-server (JWT mode, JetStream) and
// the dispatcher (--http, --auth-dir for tenant tokens).
func (f *fleet) startControl() {
	f.t.Helper()
	f.podman("network", "create", f.name)
	nats := f.name + "-nats"
	f.podman("run", "-d", "--name", nats, "--network", f.name, "-p", "127.0.0.1::4222",
		"-v", filepath.Join(f.dir, "auth")+":/auth", f.image("nats"), "-c", "/auth/nats.conf")
	f.natsIP = f.podman("inspect", "-f", "{{(index .NetworkSettings.Networks \""+f.name+"\").IPAddress}}", nats)
	f.natsURL = "nats://127.0.0.1:" + f.publishedPort(nats, "4222")
	f.waitListening(strings.TrimPrefix(f.natsURL, "nats://"))
	disp := f.name + "-dispatcher"
	f.podman("run", "-d", "--name", disp, "--network", f.name, "-p", "127.0.0.1::8080",
		"-v", filepath.Join(f.dir, "auth")+":/auth",
		"-e", "FLEET_NATS_URL=nats://"+f.natsIP+":4222", "-e", "FLEET_NATS_CREDS=/auth/dispatcher.creds",
		"-e", "FLEET_STORAGE=nats://", f.image("dispatcher"),
		"serve", "--http", "0.0.0.0:8080", "--auth-dir", "/auth")
	f.httpURL = "http://127.0.0.1:" + f.publishedPort(disp, "8080")
	f.waitListening(strings.TrimPrefix(f.httpURL, "http://"))
}

// workerArgs are podman run's arguments for a worker container named
// name, with creds mounted from the host file creds ("" for none).
func (f *fleet) workerArgs(name, creds string, unmask bool) []string {
	a := []string{"--name", name, "--hostname", name, "--network", f.name}
	if unmask {
		a = append(a, "--security-opt", "unmask=/proc/*")
	}
	if creds != "" {
		a = append(a, "-v", creds+":/run/fleet/worker.creds:ro")
	}
	return append(a, "-e", "FLEET_NATS_URL=nats://"+f.natsIP+":4222", "-e", "FLEET_STORAGE=nats://",
		"-e", "FLEET_AGENT_CMD=fleet-standin-agent", "-e", "FLEET_SLOTS=2",
		"-e", "FLEET_SHUTDOWN_GRACE=60s", f.image("worker"))
}

// startWorker starts a worker container and waits until it logs its
// isolation, which must be contained.
func (f *fleet) startWorker(name string) {
	f.t.Helper()
	f.podman(append([]string{"run", "-d"}, f.workerArgs(name, filepath.Join(f.dir, "worker.creds"), true)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", "logs", "-f", name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	var seen []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if strings.Contains(line, "local sandbox isolation") {
			if !strings.Contains(line, `"isolation":"contained"`) {
				f.t.Fatalf("%s is not contained: %s", name, line)
			}
			return
		}
	}
	f.t.Fatalf("%s ended without saying its isolation:\n%s", name, strings.Join(seen, "\n"))
}

// cliArgs are the tenant's connection flags for the dispatcher CLI.
func (f *fleet) cliArgs(args ...string) []string {
	return append(args, "--nats-url", f.natsURL, "--nats-creds", f.creds)
}

// submit submits a job as acme through NATS with the CLI.
func (f *fleet) submit(id, prompt string) {
	f.t.Helper()
	f.run(f.cli, f.cliArgs("submit", "--id", id, prompt)...)
}

// tail follows a query to its end (the CLI's tail) and returns its lines.
func (f *fleet) tail(id string) string {
	f.t.Helper()
	return f.run(f.cli, f.cliArgs("tail", id, "--raw")...)
}

// tailUntil follows a query's lines until one contains want, and returns it.
func (f *fleet) tailUntil(id, want string) string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.cli, f.cliArgs("tail", id, "--raw")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	var seen []string
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return sc.Text()
		}
		seen = append(seen, sc.Text())
	}
	st, _ := exec.Command(f.cli, f.cliArgs("status", id)...).CombinedOutput()
	f.t.Fatalf("query %s ended without a line containing %q:\n%s\nstatus: %s", id, want, strings.Join(seen, "\n"), st)
	return ""
}

// exited runs a worker container in the foreground, as an operator would,
// and returns its exit code and output. The container must exit on its own.
func (f *fleet) exited(name, creds string, unmask bool) (int, string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", append([]string{"run", "--rm"}, f.workerArgs(name, creds, unmask)...)...)
	cmd.Cancel = func() error { return exec.Command("podman", "rm", "-f", name).Run() }
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		f.t.Errorf("%s did not exit within 60s:\n%s", name, out)
		return -1, string(out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		f.t.Fatalf("podman run %s: %v", name, err)
	}
	return 0, string(out)
}
