package securetest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// Options configure a Profile.
type Options struct {
	// Workers to start (2 when 0), each with Slots slots (2 when 0).
	Workers, Slots int
	// Warm is each worker's --warm (1 when 0; -1 for none).
	Warm int
	// ModelUpstream is the workers' --model-upstream (a Messages API
	// fake's URL); with ModelKey the gateway runs in front of it.
	ModelUpstream, ModelKey string
	// AgentCmd is the workers' --agent-cmd; the stand-in agent when "".
	AgentCmd string
	// WorkerEnv is added to each worker's environment.
	WorkerEnv []string
}

// Profile is a running secure profile.
type Profile struct {
	t    testing.TB
	Bins Bins
	// Root holds everything: auth/, the server's config and store, data/.
	Root, Auth string
	// NATSURL is the server's; HTTP is `dispatcher serve`'s base URL.
	NATSURL, HTTP string
	// OperatorToken is serve's --ui-token.
	OperatorToken string
	NATS, Serve   *Proc
	Workers       []*Proc
	opts          Options
	nworker       int
}

// StartProfile sets up and starts the profile as docs/tenancy.md says.
func StartProfile(t testing.TB, o Options) *Profile {
	t.Helper()
	p := &Profile{t: t, Bins: Build(t), Root: t.TempDir(), OperatorToken: "op-" + strconv.FormatInt(time.Now().UnixNano(), 36), opts: o}
	p.Auth = filepath.Join(p.Root, "auth")
	if code, _, errs := p.Run(nil, "auth", "init", "--dir", p.Auth); code != 0 {
		t.Fatalf("auth init: exit %d: %s", code, errs)
	}
	ports := natstest.FreePorts(t, 2)
	p.NATSURL = fmt.Sprintf("nats://127.0.0.1:%d", ports[0])
	conf := filepath.Join(p.Root, "nats-server.conf")
	body := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\ninclude ./auth/%s\n", ports[0], filepath.Join(p.Root, "js"), tenancy.ConfFile)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p.NATS = Start(t, nil, p.Bins.NATSServer, "-c", conf)
	p.waitNATS()
	addr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	p.HTTP = "http://" + addr
	p.Serve = Start(t, nil, p.Bins.Dispatcher, "serve", "--nats-url", p.NATSURL, "--nats-creds", p.Creds(tenancy.DispatcherFile),
		"--http", addr, "--auth-dir", p.Auth, "--ui-token", p.OperatorToken, "--webhook-allow-private", "--webhook-backoff", "50ms",
		"--storage", "file://"+filepath.Join(p.Root, "data"), "--log-level", "debug")
	p.waitHTTP(p.HTTP+"/readyz", p.Serve)
	n := o.Workers
	if n == 0 {
		n = 2
	}
	for range n {
		p.StartWorker()
	}
	return p
}

// Creds is the path of one of the auth directory's creds files.
func (p *Profile) Creds(file string) string { return filepath.Join(p.Auth, file) }

// StartWorker starts one more worker on worker.creds and waits until it
// is ready.
func (p *Profile) StartWorker() *Proc {
	p.t.Helper()
	o := p.opts
	slots, warm, agent := o.Slots, o.Warm, o.AgentCmd
	if slots == 0 {
		slots = 2
	}
	if warm == 0 {
		warm = 1
	} else if warm < 0 {
		warm = 0
	}
	if agent == "" {
		agent = p.Bins.Standin
	}
	p.nworker++
	dir := filepath.Join(p.Root, "worker"+strconv.Itoa(p.nworker))
	port := natstest.FreePorts(p.t, 1)[0]
	upstream := o.ModelUpstream
	if upstream == "" {
		upstream = "off"
	}
	args := []string{"--nats-url", p.NATSURL, "--nats-creds", p.Creds(tenancy.WorkerFile),
		"--storage", "file://" + filepath.Join(p.Root, "data"), "--agent-cmd", agent, "--slots", strconv.Itoa(slots),
		"--journal-dir", filepath.Join(dir, "journal"), "--sandbox-dir", filepath.Join(dir, "sandboxes"),
		"--warm", strconv.Itoa(warm), "--model-upstream", upstream, "--http", fmt.Sprintf("127.0.0.1:%d", port),
		"--shutdown-grace", "5s", "--log-level", "debug"}
	env := append([]string{"ANTHROPIC_API_KEY=" + o.ModelKey}, o.WorkerEnv...)
	w := Start(p.t, env, p.Bins.Worker, args...)
	p.waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/readyz", port), w)
	p.Workers = append(p.Workers, w)
	return w
}

// Run runs `dispatcher args…` to its end (the CLI), with env added.
func (p *Profile) Run(env []string, args ...string) (int, string, string) {
	p.t.Helper()
	return Start(p.t, env, p.Bins.Dispatcher, args...).Wait(p.t)
}

// RunNATS is Run with --nats-url added.
func (p *Profile) RunNATS(args ...string) (int, string, string) {
	p.t.Helper()
	return p.Run(nil, append(args, "--nats-url", p.NATSURL)...)
}

// TenantCreds mints tenant's creds file and returns its path.
func (p *Profile) TenantCreds(tenant string) string {
	p.t.Helper()
	out := filepath.Join(p.Root, tenant+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".creds")
	if code, _, errs := p.RunNATS("tenant", "creds", tenant, "--dir", p.Auth, "--out", out); code != 0 {
		p.t.Fatalf("tenant creds %s: exit %d: %s", tenant, code, errs)
	}
	return out
}

// TenantToken mints tenant's bearer token.
func (p *Profile) TenantToken(tenant string) string {
	p.t.Helper()
	code, out, errs := p.Run(nil, "tenant", "token", tenant, "--dir", p.Auth)
	if code != 0 {
		p.t.Fatalf("tenant token %s: exit %d: %s", tenant, code, errs)
	}
	return strings.TrimSpace(out)
}

// Connect connects with a creds file (a tenant's: its inbox prefix).
func (p *Profile) Connect(creds string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.UserCredentials(creds), nats.MaxReconnects(0)}, opts...)
	return nats.Connect(p.NATSURL, opts...)
}

func (p *Profile) waitNATS() {
	p.t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		nc, err := p.Connect(p.Creds(tenancy.AdminFile))
		if err == nil {
			nc.Close()
			return
		}
		if p.NATS.Exited() || time.Now().After(deadline) {
			p.t.Fatalf("nats-server did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a port: no event to wait on
	}
}

func (p *Profile) waitHTTP(url string, proc *Proc) {
	p.t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if proc.Exited() || time.Now().After(deadline) {
			p.t.Fatalf("%s never answered 200 (%v); stderr:\n%s", url, err, proc.Stderr())
		}
		time.Sleep(50 * time.Millisecond) // polling a port: no event to wait on
	}
}
