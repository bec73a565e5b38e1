// Package fleettest runs a whole fleet inside a test or benchmark process: a
// real JetStream server (embedded), the dispatcher service, workers with the
// local sandbox and the stand-in agent (the test binary itself), and file
// storage. For tests and benchmarks only: it links nats-server.
package fleettest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/archiver"
	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/standin"
	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/tracing"
	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// StandinFlag makes the test binary act as the stand-in agent.
const StandinFlag = "--standin-agent"

// Main is the TestMain of packages that use the fleet: it runs the child
// modes (stand-in agent, worker process) and otherwise the tests.
func Main(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == StandinFlag {
		os.Exit(standin.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == WorkerFlag {
		os.Exit(workerProcess(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == DispatcherFlag {
		os.Exit(dispatcherProcess(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// MainNoLeaks is Main for packages that must not leak goroutines: after
// the tests, goleak fails the run if any goroutine is left.
func MainNoLeaks(m *testing.M, opts ...goleak.Option) {
	if len(os.Args) > 1 && (os.Args[1] == StandinFlag || os.Args[1] == WorkerFlag || os.Args[1] == DispatcherFlag) {
		Main(m)
	}
	goleak.VerifyTestMain(m, opts...)
}

// AgentCommand is the stand-in agent: this test binary in stand-in mode.
func AgentCommand(t testing.TB) []string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return []string{exe, StandinFlag}
}

// Opts configure a Fleet.
type Opts struct {
	MaxConcurrency int
	AckWait        time.Duration
	MaxDeliver     int
	DedupeWindow   time.Duration
	ServerOpts     []natstest.Option
	// Replicas of the fleet's streams (3 on a cluster). Defaults to 1.
	Replicas int
	// Server, if set, is used instead of starting one (e.g. one started
	// from deploy/nats/nats-server.conf).
	Server *server.Server
	// Connect, if set, makes the connection of a role: "dispatcher",
	// "worker" or "client". Defaults to an unauthenticated natstest.Connect.
	Connect func(t testing.TB, role string) *nats.Conn
	// SessionTTL and SessionSweep configure the dispatcher's expiry of
	// parked sessions.
	SessionTTL, SessionSweep time.Duration
	// Admission configures the dispatcher's admitter (defaults, clock).
	Admission admission.Config
	// StorageURL, if set, is where objects and status records go instead
	// of a file store in the test's directory (e.g. "nats://"), opened as
	// `dispatcher serve` opens --storage, with Replicas.
	StorageURL string
	// Tracing makes the dispatcher's spans; nil is off.
	Tracing *tracing.Tracing
	// GitHub and PublicURL configure the dispatcher's GitHub App.
	GitHub        *github.App
	PublicURL     string
	GitHubBackoff []time.Duration
}

// Fleet is one embedded JetStream server with the dispatcher service and
// file storage, plus helpers to start workers and follow queries.
type Fleet struct {
	t       testing.TB
	Srv     *server.Server
	NC      *nats.Conn
	JS      jetstream.JetStream
	Names   protocol.Names
	Dir     string
	Objects storage.Store
	Status  storage.Store // status records: Objects, unless Opts.StorageURL is set
	Disp    *dispatcher.Service
	Arch    *archiver.Service // writes transcripts from the stream, as `dispatcher serve` does
	Client  *fleetapi.Client
	Logger  zerolog.Logger
	connect func(t testing.TB, role string) *nats.Conn
	dispCfg dispatcher.Config
}

// StopDispatcher stops the fleet's dispatcher service.
func (f *Fleet) StopDispatcher() {
	f.t.Helper()
	require.NoError(f.t, f.Disp.Stop(context.Background()))
}

// StartDispatcher starts a new dispatcher service in place of a stopped
// one, with the same configuration (as a restarted process would).
func (f *Fleet) StartDispatcher() {
	f.t.Helper()
	d, err := dispatcher.New(f.dispCfg)
	require.NoError(f.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(f.t, d.Start(ctx))
	f.Disp = d
	f.t.Cleanup(func() { _ = d.Stop(context.Background()) })
}

// New starts a fleet (server, dispatcher, storage) for t.
func New(t testing.TB, o Opts) *Fleet {
	t.Helper()
	srv := o.Server
	if srv == nil {
		srv = natstest.RunServer(t, o.ServerOpts...)
	}
	connect := o.Connect
	if connect == nil {
		connect = func(t testing.TB, _ string) *nats.Conn {
			nc, _ := natstest.Connect(t, srv)
			return nc
		}
	}
	nc := connect(t, "dispatcher")
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	dir := t.TempDir()
	names := protocol.NewNames("")
	var objects, status storage.Store
	if o.StorageURL == "" {
		objects, err = storage.NewFS(filepath.Join(dir, "data"))
		require.NoError(t, err)
		status = objects
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err = provision.Retry(ctx, func(ctx context.Context) (err error) {
			objects, status, err = backends.OpenBoth(ctx, o.StorageURL, o.StorageURL, backends.Deps{
				JS: js, StatusBucket: names.StatusBucket(), ObjectBucket: names.ObjectBucket(), Replicas: o.Replicas})
			return err
		})
		cancel()
		require.NoError(t, err)
		t.Cleanup(func() { _ = objects.Close(); _ = status.Close() })
	}
	f := &Fleet{t: t, Srv: srv, NC: nc, JS: js, Names: names, Dir: dir, Objects: objects, Status: status, connect: connect}
	f.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(logLevel())
	if o.AckWait == 0 {
		o.AckWait = 30 * time.Second
	}
	f.dispCfg = dispatcher.Config{
		NC: nc, Status: status, Objects: objects, Logger: &f.Logger, SessionTTL: o.SessionTTL, SessionSweep: o.SessionSweep,
		Provision: provision.Config{Names: f.Names, MaxConcurrency: o.MaxConcurrency, AckWait: o.AckWait, MaxDeliver: o.MaxDeliver, DedupeWindow: o.DedupeWindow, Storage: jetstream.FileStorage, Replicas: o.Replicas},
		Admission: o.Admission, Tracing: o.Tracing, GitHub: o.GitHub, PublicURL: o.PublicURL, GitHubBackoff: o.GitHubBackoff,
	}
	f.Disp, err = dispatcher.New(f.dispCfg)
	require.NoError(t, err)
	// Generous: on a 3-node cluster, provisioning R3 streams and KV buckets
	// while every test package runs at once on 2 cores took over 30s in CI.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, f.Disp.Start(ctx))
	t.Cleanup(func() { _ = f.Disp.Stop(context.Background()) })
	f.Arch, err = archiver.New(archiver.Config{NC: nc, Names: f.Names, Store: objects, Retry: 200 * time.Millisecond, Logger: &f.Logger})
	require.NoError(t, err)
	require.NoError(t, f.Arch.Start(ctx))
	t.Cleanup(func() {
		// Bounded: a test may have taken the server away for good.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = f.Arch.Stop(ctx)
	})
	f.Client, err = fleetapi.NewClient(connect(t, "client"), f.Names)
	require.NoError(t, err)
	return f
}

// Worker is an in-process worker with its journal and connection.
type Worker struct {
	W       *worker.Worker
	Journal *journal.Journal
	NC      *nats.Conn
}

// WorkerOpts configure a worker.
type WorkerOpts struct {
	Slots    int
	Store    storage.Store // journal/transcript store; defaults to the fleet's
	Grace    time.Duration
	Mod      func(*worker.Config)
	AgentMod func(*agent.Config)
	EnvAllow []string
	// JournalMod changes the journal's config (e.g. its fault seam).
	JournalMod func(*journal.Config)
	// SandboxEnv is fixed environment for every sandboxed process.
	SandboxEnv map[string]string
}

// StartWorker starts an in-process worker with its own connection, journal
// and sandbox directory.
func (f *Fleet) StartWorker(o WorkerOpts) *Worker {
	t := f.t
	t.Helper()
	nc := f.connect(t, "worker")
	store := o.Store
	if store == nil {
		store = f.Objects
	}
	jdir := t.TempDir()
	lineLimit := worker.NewLineLimit(nc, f.Names.QueriesStream())
	jcfg := journal.Config{
		Dir: jdir, Store: store, Logger: &f.Logger, LargeLineBytesFunc: lineLimit,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		SpillAfter: worker.DefaultJournalSpillAfter,
	}
	merge := transcript.NewReader(nc, f.Names, store).MergeIfArchived
	jcfg.AssembleFunc, jcfg.NonFinalFunc = merge, merge
	if o.JournalMod != nil {
		o.JournalMod(&jcfg)
	}
	jl, err := journal.New(jcfg)
	require.NoError(t, err)
	require.NoError(t, jl.Start(context.Background()))
	// Not contained, explicitly: the fleet's suites test the fleet, the
	// contained ones (e2e contained_test.go) replace this provider.
	local, err := sandbox.NewLocal(sandbox.LocalConfig{Root: t.TempDir(), EnvAllow: o.EnvAllow, Env: o.SandboxEnv,
		Isolation: sandbox.IsolationNone})
	require.NoError(t, err)
	acfg := agent.Config{Command: AgentCommand(t), ResultGrace: 5 * time.Second, KillGrace: 2 * time.Second, Logger: &f.Logger}
	if o.AgentMod != nil {
		o.AgentMod(&acfg)
	}
	runner, err := agent.New(acfg)
	require.NoError(t, err)
	// Workspaces on the worker's store; file:// allowed, for repositories made in the test.
	ws, err := workspace.New(workspace.Config{Store: store, AllowFile: true, Logger: &f.Logger})
	require.NoError(t, err)
	cfg := worker.Config{
		NC: nc, Names: f.Names, Slots: o.Slots, Providers: map[string]sandbox.Provider{"local": local},
		Runner: runner, Journal: jl, LineLimit: lineLimit, ShutdownGrace: o.Grace, Logger: &f.Logger,
		ConsumerRetry: 50 * time.Millisecond, Workspaces: ws,
		Sessions:    session.Config{Command: acfg.Command, KillGrace: acfg.KillGrace, Logger: &f.Logger},
		Checkpoints: store,
	}
	if o.Mod != nil {
		o.Mod(&cfg)
	}
	w, err := worker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	b := &Worker{W: w, Journal: jl, NC: nc}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
		_ = jl.Stop(ctx)
	})
	return b
}

// StopFirstOnCleanup registers, now, a cleanup that stops workers (and
// their journals), the archiver and the dispatcher. Cleanups run last
// registered first, so a test that restarted its server
// (natstest.Restart registers the new server's shutdown after the fleet's
// stops) calls it after the restart: the fleet then stops while the
// server is still there, instead of every stop waiting out its timeout
// against a server already gone (about 25 s). Stopping twice is harmless.
func (f *Fleet) StopFirstOnCleanup(workers ...*Worker) {
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, w := range workers {
			_ = w.W.Stop(ctx)
			_ = w.Journal.Stop(ctx)
		}
		_ = f.Arch.Stop(ctx)
		_ = f.Disp.Stop(ctx)
	})
}

// WaitReady waits until w pulls.
func WaitReady(t testing.TB, w *worker.Worker) {
	t.Helper()
	Eventually(t, 2*time.Minute, w.Ready, "worker ready")
}

// Eventually polls cond (a state with no event to wait on) within d.
func Eventually(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// PublishJob publishes a job directly on fleet.jobs.<tenant>, as any client would.
func (f *Fleet) PublishJob(tenant string, body []byte, hdr map[string]string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.JS.PublishMsg(ctx, f.jobMsg(tenant, body, hdr))
	require.NoError(f.t, err)
}

// jobMsg is a job's message on tenant's jobs subject, with headers hdr.
func (f *Fleet) jobMsg(tenant string, body []byte, hdr map[string]string) *nats.Msg {
	m := nats.NewMsg(f.Names.JobSubject(tenant))
	m.Data = body
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	return m
}

// SubmitJSON publishes {"id","prompt"} directly with Nats-Msg-Id. A publish
// the stream does not acknowledge (its leader being elected on a cluster)
// is sent again with the same id, as a producer would: the server's
// duplicate window keeps it one job. It gives up after a minute.
func (f *Fleet) SubmitJSON(tenant, id, prompt string) {
	f.t.Helper()
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt})
	require.NoError(f.t, err)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := f.JS.PublishMsg(ctx, f.jobMsg(tenant, b, map[string]string{protocol.HeaderMsgID: id}))
		cancel()
		if err == nil {
			return
		}
		unacked := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
			errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
		if !unacked || time.Now().After(deadline) {
			require.NoError(f.t, err)
		}
		f.t.Logf("submitting %s: %v; sending it again with the same Nats-Msg-Id", id, err)
	}
}

// Run is what a subscriber saw of one query.
type Run struct {
	Lines    []fleetapi.Line
	Statuses []protocol.StatusEvent
	Final    *protocol.StatusEvent
}

// Follow replays and follows a query until its terminal status.
func (f *Fleet) Follow(tenant, id string, timeout time.Duration) Run {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var r Run
	var mu sync.Mutex
	final, err := f.Client.Follow(ctx, tenant, id, true, fleetapi.Follower{
		Line: func(l fleetapi.Line) {
			mu.Lock()
			l.Data = append([]byte(nil), l.Data...)
			r.Lines = append(r.Lines, l)
			mu.Unlock()
		},
		Status: func(ev protocol.StatusEvent) { mu.Lock(); r.Statuses = append(r.Statuses, ev); mu.Unlock() },
	})
	require.NoError(f.t, err, "following %s/%s", tenant, id)
	r.Final = final
	return r
}

// RequireContiguous checks Fleet-Seq runs 1..n with no gap or repeat, the
// stream ends with a result line, and returns the lines' bytes.
func RequireContiguous(t testing.TB, r Run) [][]byte {
	t.Helper()
	require.NotEmpty(t, r.Lines)
	out := make([][]byte, 0, len(r.Lines))
	for i, l := range r.Lines {
		require.Equal(t, uint64(i+1), l.Seq, "Fleet-Seq must be contiguous and ordered")
		out = append(out, l.Data)
	}
	require.True(t, protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).IsResult(), "the stream ends with a result line")
	return out
}

// Transcript waits until the query's transcript is assembled and returns it.
func (f *Fleet) Transcript(store storage.Store, tenant, id string) []byte {
	f.t.Helper()
	var b []byte
	Eventually(f.t, 2*time.Minute, func() bool {
		var err error
		b, err = store.Get(context.Background(), storage.TranscriptKey(tenant, id))
		return err == nil
	}, "transcript of "+tenant+"/"+id)
	return b
}

// JoinLines joins lines with a newline after each, as a transcript does.
func JoinLines(lines [][]byte) []byte {
	var out []byte
	for _, l := range lines {
		out = append(out, l...)
		out = append(out, '\n')
	}
	return out
}

// Itoa is strconv.Itoa.
func Itoa(i int) string { return strconv.Itoa(i) }

// logLevel is warn, or FLEET_TEST_LOG_LEVEL when set (debugging a test).
func logLevel() zerolog.Level {
	if l, err := zerolog.ParseLevel(os.Getenv("FLEET_TEST_LOG_LEVEL")); err == nil && l != zerolog.NoLevel {
		return l
	}
	return zerolog.WarnLevel
}

// History reads everything the stream holds of a query now (lines and
// statuses, including any status after the first terminal one).
func (f *Fleet) History(tenant, id string) Run {
	f.t.Helper()
	r, err := f.TryHistory(tenant, id)
	require.NoError(f.t, err)
	return r
}

// TryHistory is History that returns its error (e.g. while a cluster node
// is coming back).
func (f *Fleet) TryHistory(tenant, id string) (Run, error) {
	var r Run
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, err := jsconsumer.Ordered(ctx, f.JS, f.Names.QueriesStream(), f.Names.QueryAll(tenant, id))
	if err != nil {
		return r, err
	}
	defer jsconsumer.Release(f.JS, f.Names.QueriesStream(), cons)
	info, err := cons.Info(ctx)
	if err != nil {
		return r, err
	}
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 500)), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			return r, err
		}
		for m := range batch.Messages() {
			left--
			switch m.Subject() {
			case f.Names.QueryMsg(tenant, id):
				seq, _ := strconv.ParseUint(m.Headers().Get(protocol.HeaderSeq), 10, 64)
				att, _ := strconv.Atoi(m.Headers().Get(protocol.HeaderAttempt))
				r.Lines = append(r.Lines, fleetapi.Line{Seq: seq, Attempt: att, Data: append([]byte(nil), m.Data()...)})
			case f.Names.QueryStatus(tenant, id):
				var ev protocol.StatusEvent
				if err := json.Unmarshal(m.Data(), &ev); err != nil {
					return r, err
				}
				r.Statuses = append(r.Statuses, ev)
				if ev.State.Terminal() && r.Final == nil {
					r.Final = &ev
				}
			}
		}
		if err := batch.Error(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// RequireOneTerminal checks that a query's history holds exactly one
// terminal status.
func RequireOneTerminal(t testing.TB, r Run) {
	t.Helper()
	var terminal []string
	for _, ev := range r.Statuses {
		if ev.State.Terminal() {
			terminal = append(terminal, string(ev.State)+"@"+strconv.Itoa(ev.Attempt))
		}
	}
	require.Len(t, terminal, 1, "exactly one terminal status; statuses: %v", statesOf(r.Statuses))
}

func statesOf(evs []protocol.StatusEvent) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, string(ev.State)+"@"+strconv.Itoa(ev.Attempt))
	}
	return out
}
