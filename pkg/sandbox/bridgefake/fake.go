package bridgefake

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// MaxFileBytes is the largest file PUT /file accepts (the real bridge's
// 32 MiB RPC payload limit).
const MaxFileBytes = 32 << 20

// DefaultPath is the PATH of fake sandbox processes unless Options.Path is
// set: the usual PATH of a Linux container.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Always makes DropStreamAfter cut every stream connection.
const Always = -1

// ExitMode says how a stream ends once its process has exited.
type ExitMode int

const (
	// ExitNormal sends the exit event, then ends the response.
	ExitNormal ExitMode = iota
	// ExitOmit ends the response without an exit event (every time).
	ExitOmit
	// ExitHang never sends the exit event and keeps the stream open,
	// pinging, until the client goes away.
	ExitHang
	// ExitError sends an error event instead of the exit event.
	ExitError
)

// Options configures a Fake. Every field is optional.
type Options struct {
	// Token is the bearer token. Defaults to a random one (see Fake.Token).
	Token string
	// PingInterval is the interval of ": ping" comments. Defaults to 100ms
	// (the real bridge uses 15s).
	PingInterval time.Duration
	// Path is the PATH of processes. Defaults to DefaultPath.
	Path string
	// BaseEnv is added to every process's base environment.
	BaseEnv map[string]string
	// GitCredentials, if set, are held by the fake like the Worker's
	// GIT_CREDENTIALS secret: processes reach http:// remotes through a
	// loopback egress proxy (http_proxy) that adds them, so git
	// authenticates without ever seeing them.
	GitCredentials workspace.Credentials
	// ModelUpstream, if set, makes the fake meter model calls like the
	// Worker's egress for api.anthropic.com: processes get
	// ANTHROPIC_BASE_URL (a loopback egress naming their sandbox) and a
	// placeholder ANTHROPIC_API_KEY; calls of a sandbox with a run opened
	// by PUT /v1/sb/:id/model go to this upstream with ModelAPIKey,
	// metered and capped by pkg/gateway; others get 401.
	ModelUpstream string
	// ModelAPIKey is the key the fake Worker holds for ModelUpstream.
	ModelAPIKey string
	// Dir holds the sandboxes' directories. Defaults to tb.TempDir().
	Dir string
	// OutputWindow is how many bytes of a process's stdout (and, apart,
	// stderr) may be read ahead of what streams have sent before the fake
	// stops reading its pipe, so an unread stream back-pressures the
	// process as a full pipe would. Defaults to 1 MiB.
	OutputWindow int64
	// Legacy plays a bridge Worker from before GET /v1/version (older than
	// sandbox.BridgeVersion): neither that route nor the /model routes
	// exist (404 as any unknown route), as a worker of this release meets
	// the previous release's bridge.
	Legacy bool
}

// Fake is a running fake bridge. Its methods are safe for concurrent use.
type Fake struct {
	opts    Options
	srv     *httptest.Server
	model   *modelEgress // the model runs; an egress only with Options.ModelUpstream
	closing chan struct{}
	once    sync.Once
	procWG  sync.WaitGroup

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	// faults
	failCreate       int
	failCreateStatus int
	createDelay      time.Duration
	dropAfter        int64
	dropTimes        int
	dropAbort        bool
	exitMode         ExitMode
	noPings          bool
	failStdin        int
	failStdinAfter   bool
	failModel        int

	// counters
	creates, deletes, unauthorized int
	versions                       int // GET /v1/version, answered or not
	starts, launches, streams      map[string]int
	kills                          map[string][]string
	envs                           map[string][]string // sandbox/proc → env
	stdinWrites                    map[string]int
}

type sandbox struct {
	id string
	// marker is in every process's environment (markerEnv): destroy finds
	// and kills what left the process groups it started (a tool the agent
	// ran in a session of its own), as a real sandbox's teardown would.
	marker string
	dir    string
	ws     string
	root   *os.Root
	env    map[string]string
	procs  map[string]*proc
}

// New starts a fake bridge on a loopback httptest server and registers its
// Close with tb.Cleanup.
func New(tb testing.TB, opts Options) *Fake {
	tb.Helper()
	if opts.Token == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		opts.Token = "bridgefake-" + hex.EncodeToString(b)
	}
	opts.PingInterval = cmp.Or(opts.PingInterval, 100*time.Millisecond)
	opts.Path = cmp.Or(opts.Path, DefaultPath)
	opts.OutputWindow = cmp.Or(opts.OutputWindow, 1<<20)
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	if opts.GitCredentials.Len() > 0 {
		proxy := startGitEgress(tb, opts.GitCredentials)
		env := maps.Clone(opts.BaseEnv)
		if env == nil {
			env = map[string]string{}
		}
		env["http_proxy"] = proxy
		opts.BaseEnv = env
	}
	f := &Fake{
		opts:        opts,
		closing:     make(chan struct{}),
		sandboxes:   map[string]*sandbox{},
		starts:      map[string]int{},
		launches:    map[string]int{},
		streams:     map[string]int{},
		kills:       map[string][]string{},
		stdinWrites: map[string]int{},
		envs:        map[string][]string{},
	}
	f.model = startModelEgress(tb, opts.ModelUpstream, cmp.Or(opts.ModelAPIKey, "bridgefake-model-key"))
	f.srv = httptest.NewServer(handlers{f}.routes())
	tb.Cleanup(f.Close)
	return f
}

// URL is the bridge's base URL.
func (f *Fake) URL() string { return f.srv.URL }

// Token is the bearer token the fake accepts.
func (f *Fake) Token() string { return f.opts.Token }

// Client returns an HTTP client for the fake's server.
func (f *Fake) Client() *http.Client { return f.srv.Client() }

// Close kills every process group, ends open streams, stops the server and
// waits for the fake's goroutines. It is idempotent.
func (f *Fake) Close() {
	f.once.Do(func() {
		close(f.closing)
		f.mu.Lock()
		var all []*sandbox
		for _, sb := range f.sandboxes {
			all = append(all, sb)
		}
		f.sandboxes = map[string]*sandbox{}
		f.mu.Unlock()
		for _, sb := range all {
			handlers{f}.destroy(sb)
		}
		// Unblock stream handlers stuck writing to clients that stopped
		// reading; Close waits for every handler.
		f.srv.CloseClientConnections()
		f.srv.Close()
		f.procWG.Wait()
	})
}

// FailCreate makes the next n create calls answer 503 CONTAINER_UNAVAILABLE.
func (f *Fake) FailCreate(n int) { f.FailCreateStatus(http.StatusServiceUnavailable, n) }

// FailCreateStatus makes the next n create calls answer status.
func (f *Fake) FailCreateStatus(status, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failCreate, f.failCreateStatus = n, status
}

// DelayCreate makes every create call wait d before answering (a cold start).
func (f *Fake) DelayCreate(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createDelay = d
}

// DropStreamAfter cuts the next `times` stream connections (Always: every
// one) once they have sent n bytes of output (counted per connection, both
// fds); a chunk crossing the limit is split so exactly n bytes go out. The
// connection ends cleanly (EOF without exit) unless SetDropAbort(true).
// times 0 turns dropping off.
func (f *Fake) DropStreamAfter(n int64, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropAfter, f.dropTimes = n, times
}

// SetDropAbort makes dropped streams abort the TCP connection (a read error
// at the client) instead of ending the response cleanly.
func (f *Fake) SetDropAbort(abort bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropAbort = abort
}

// SetExitMode sets how streams end once their process has exited.
func (f *Fake) SetExitMode(m ExitMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exitMode = m
}

// SetPings turns the ": ping" comments on (the default) or off.
func (f *Fake) SetPings(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noPings = !on
}

// Creates is the number of authorized create calls, failed ones included.
func (f *Fake) Creates() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creates
}

// VersionAsks is the number of GET /v1/version calls (a Legacy fake
// counts the 404s it answers).
func (f *Fake) VersionAsks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.versions
}

// Deletes is the number of DELETE /v1/sb/:id calls.
func (f *Fake) Deletes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deletes
}

// Unauthorized is the number of requests refused for a missing or wrong token.
func (f *Fake) Unauthorized() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unauthorized
}

// Starts is the number of start calls for procID (in any sandbox).
func (f *Fake) Starts(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts[procID]
}

// Launches is the number of processes actually started for procID.
func (f *Fake) Launches(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.launches[procID]
}

// StreamConnects is the number of stream requests for procID.
func (f *Fake) StreamConnects(procID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams[procID]
}

// Kills lists the signals of the kill calls for procID, in order.
func (f *Fake) Kills(procID string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.kills[procID]...)
}

// ProcEnv is the environment ("NAME=value") process procID of sandboxID was
// started with, or nil.
func (f *Fake) ProcEnv(sandboxID, procID string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.envs[sandboxID+"/"+procID]...)
}

// Workspace is the host directory of sandboxID's workspace, or "" if the
// sandbox does not exist.
func (f *Fake) Workspace(sandboxID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxes[sandboxID]; sb != nil {
		return sb.ws
	}
	return ""
}
