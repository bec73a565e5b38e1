package sandbox_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// escapeHost is what a test agent tries to reach: secrets planted where
// docs/contained.md says a contained agent cannot look, a stand-in for the worker
// process, a loopback server and two HTTP servers, one on the job's allow
// list.
type escapeHost struct {
	secret                        string
	dataFile, credsFile, rootFile string
	outside                       string // a host directory outside every sandbox
	standIn                       *exec.Cmd
	loopback                      string // host:port of a plain TCP listener
	allowedURL, deniedURL         string
	allowedPort, deniedPort       int
	allowedAddr                   string
	refusedMu                     sync.Mutex
	refused                       []egress.Refusal
}

func newEscapeHost(t *testing.T) *escapeHost {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	h := &escapeHost{secret: "secret-" + hex.EncodeToString(b)}
	base := t.TempDir()
	h.dataFile = filepath.Join(base, "data", "journal", "run.json")
	h.credsFile = filepath.Join(base, "creds", "nats.creds")
	h.outside = filepath.Join(base, "outside")
	for _, f := range []string{h.dataFile, h.credsFile} {
		require.NoError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		require.NoError(t, os.WriteFile(f, []byte(h.secret), 0o644))
	}
	require.NoError(t, os.MkdirAll(h.outside, 0o777))
	if os.Geteuid() == 0 {
		h.rootFile = "/root/.agentfleet-escape-" + hex.EncodeToString(b)
		require.NoError(t, os.WriteFile(h.rootFile, []byte(h.secret), 0o644))
		t.Cleanup(func() { _ = os.Remove(h.rootFile) })
	}

	h.standIn = exec.Command("sleep", "300")
	h.standIn.Env = []string{"WORKER_SECRET=" + h.secret}
	require.NoError(t, h.standIn.Start())
	t.Cleanup(func() { _ = h.standIn.Process.Kill(); _ = h.standIn.Wait() })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	h.loopback = ln.Addr().String()

	serve := func(name string) (string, int, string) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = fmt.Fprint(w, name)
		}))
		t.Cleanup(srv.Close)
		_, ps, _ := net.SplitHostPort(srv.Listener.Addr().String())
		port, _ := strconv.Atoi(ps)
		return fmt.Sprintf("http://localhost:%d/", port), port, srv.Listener.Addr().String()
	}
	h.allowedURL, h.allowedPort, h.allowedAddr = serve("allowed-body")
	h.deniedURL, h.deniedPort, _ = serve("denied-body")
	return h
}

// network is the job's network for the escape runs: the allowed server
// on the list, and a forward to it at inside port 18089.
func (h *escapeHost) network() *sandbox.Network {
	p, _ := egress.Parse([]byte(fmt.Sprintf(`{"allow":["localhost:%d"]}`, h.allowedPort)))
	loopback, _ := egress.ParseAllow("127.0.0.0/8")
	return &sandbox.Network{
		Policy:   p,
		Deny:     loopback, // the operator allows the test's loopback servers
		Forwards: []sandbox.Forward{{Port: 18089, To: h.allowedAddr}},
		OnRefused: func(r egress.Refusal) {
			h.refusedMu.Lock()
			h.refused = append(h.refused, r)
			h.refusedMu.Unlock()
		},
	}
}

// probe runs one try-* step in a fresh sandbox of iso and returns its line.
func (h *escapeHost) probe(t *testing.T, iso string, step string) string {
	t.Helper()
	b := setupLocal(t, sandbox.LocalConfig{Isolation: iso})
	other := b.create(t, "other-run", nil)
	require.NoError(t, other.WriteFile(testCtx(t), "secret.txt", []byte(h.secret)))
	step = strings.ReplaceAll(step, "{other}", filepath.Join(b.root, "other-run", "work", "secret.txt"))
	sb := b.create(t, "agent-run", nil)
	out, st := run(t, sb, sandbox.ProcSpec{Network: h.network()}, step)
	require.Equal(t, 0, st.Code, st.StderrTail)
	return strings.TrimSpace(out)
}

// TestContainedEscapes has a test agent try each thing docs/contained.md says a
// contained agent cannot do. Each case runs twice: contained, where it
// must fail, and with isolation none, where the same attempt must succeed
// (so the test would catch containment switched off).
func TestContainedEscapes(t *testing.T) {
	requireContained(t)
	h := newEscapeHost(t)
	cases := []struct {
		name, step string
		escaped    func(line string) bool
	}{
		{"ReadWorkerData", "try-read " + h.dataFile, h.hasSecret},
		{"ReadCredsFile", "try-read " + h.credsFile, h.hasSecret},
		{"ReadOtherRunSandbox", "try-read {other}", h.hasSecret},
		{"ReadWorkerEnviron", fmt.Sprintf("try-read /proc/%d/environ", h.standIn.Process.Pid), h.hasSecret},
		{"SignalWorker", fmt.Sprintf("try-signal %d", h.standIn.Process.Pid), isOK},
		{"WriteOutside", "try-write " + filepath.Join(h.outside, "escaped.txt"), isOK},
		{"DialAroundProxy", "try-dial " + h.loopback, isOK},
		{"UserNamespace", "try-userns", isOK},
		{"HostNotOnList", "try-get " + h.deniedURL, func(l string) bool { return strings.HasPrefix(l, "ok 200 denied-body") }},
	}
	if h.rootFile != "" {
		cases = append(cases, struct {
			name, step string
			escaped    func(line string) bool
		}{"ReadUnderRoot", "try-read " + h.rootFile, h.hasSecret})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "SignalWorker" {
				// The control (none) kills the stand-in: contained first.
				line := h.probe(t, sandbox.IsolationContained, tc.step)
				require.False(t, tc.escaped(line), "contained: %s", line)
				require.Nil(t, h.standIn.ProcessState, "the worker stand-in is alive")
				line = h.probe(t, sandbox.IsolationNone, tc.step)
				require.True(t, tc.escaped(line), "control (isolation none) must escape: %s", line)
				return
			}
			line := h.probe(t, sandbox.IsolationContained, tc.step)
			require.False(t, tc.escaped(line), "contained: %s", line)
			if tc.name == "WriteOutside" {
				require.NoFileExists(t, filepath.Join(h.outside, "escaped.txt"))
			}
			line = h.probe(t, sandbox.IsolationNone, tc.step)
			require.True(t, tc.escaped(line), "control (isolation none) must escape: %s", line)
			if tc.name == "WriteOutside" {
				require.NoError(t, os.Remove(filepath.Join(h.outside, "escaped.txt")))
			}
		})
	}
	h.refusedMu.Lock()
	defer h.refusedMu.Unlock()
	require.Equal(t, []egress.Refusal{{Host: "localhost", Port: h.deniedPort}}, h.refused,
		"the proxy reported the refused host once")
}

func (h *escapeHost) hasSecret(line string) bool { return strings.Contains(line, h.secret) }

func isOK(line string) bool { return line == "ok" }

// TestContainedNetworkReachesWhatItMay: the forward (the model gateway's
// way in) and a listed host through the proxy work contained.
func TestContainedNetworkReachesWhatItMay(t *testing.T) {
	requireContained(t)
	h := newEscapeHost(t)
	require.Equal(t, "ok 200 allowed-body", h.probe(t, sandbox.IsolationContained, "try-get "+h.allowedURL))
	require.Equal(t, "ok 200 allowed-body", h.probe(t, sandbox.IsolationContained, "try-get http://127.0.0.1:18089/"))
	n := h.network()
	require.Equal(t, "127.0.0.1:18089", n.Reach(n.Forwards[0], true))
	require.Equal(t, h.allowedAddr, n.Reach(n.Forwards[0], false))
}

// TestContainedHidesEnvironment: bwrap's own processes (PID 1 inside is
// bwrap) show neither the worker's environment nor the agent's, and the
// agent runs as the agent uid, owning what it writes on the host.
func TestContainedHidesEnvironment(t *testing.T) {
	requireContained(t)
	t.Setenv("FLEET_NATS_CREDS", "worker-secret-in-env")
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "env", map[string]string{"AGENT_TOKEN": "agent-token-value"})
	out, st := run(t, sb, sandbox.ProcSpec{}, "try-read /proc/1/environ", "try-read /proc/1/cmdline",
		"env", "write-file made.txt x")
	require.Equal(t, 0, st.Code, st.StderrTail)
	require.NotContains(t, out, "worker-secret-in-env")
	lines := strings.SplitN(out, "\n", 3)
	require.NotContains(t, lines[0]+lines[1], "agent-token-value", "bwrap's environ and cmdline hold no env value")
	require.Contains(t, lines[2], `"AGENT_TOKEN":"agent-token-value"`, "the agent itself has its env")
	if os.Geteuid() == 0 {
		fi, err := os.Stat(filepath.Join(b.root, "env", "work", "made.txt"))
		require.NoError(t, err)
		require.Equal(t, uint32(sandbox.DefaultAgentUID), fi.Sys().(*syscall.Stat_t).Uid, "the agent's file is the agent uid's on the host")
	}
}

// TestContainedOpenNetwork: "open" shares the worker's network namespace,
// so what a "none" or allow-list sandbox cannot dial is reached.
func TestContainedOpenNetwork(t *testing.T) {
	requireContained(t)
	h := newEscapeHost(t)
	b := setupLocal(t, sandbox.LocalConfig{Isolation: sandbox.IsolationContained})
	sb := b.create(t, "open", nil)
	n := &sandbox.Network{Policy: egress.Policy{Mode: egress.Open}}
	out, st := run(t, sb, sandbox.ProcSpec{Network: n}, "try-dial "+h.loopback, "try-read "+h.credsFile)
	require.Equal(t, 0, st.Code, st.StderrTail)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Equal(t, "ok", lines[0], "open reaches the host's loopback")
	require.False(t, h.hasSecret(lines[1]), "open is network only: files stay hidden: %s", lines[1])
}
