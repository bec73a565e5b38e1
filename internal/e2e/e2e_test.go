// Package e2e runs the whole fleet (dispatcher, workers, journal, storage,
// local sandbox, stand-in agent) on a real JetStream server embedded in the
// test process.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/archiver"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/securetest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// TestMain checks that no goroutine is left, but one of nats.go v1.55.0's:
// PublishAsync starts resetPendingAcksOnReconnect, which reads the
// publisher's status channel under its lock; when CleanupPublisher sets it
// to nil first, the goroutine waits on the nil channel forever. It holds
// nothing of ours.
func TestMain(m *testing.M) {
	fleettest.MainNoLeaks(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		goleak.Cleanup(func(code int) { securetest.Cleanup(); os.Exit(code) }))
}

// wait bounds every wait for an event. It is generous because `make test`
// runs every package at once under the race detector on 2 cores; a wait
// that succeeds returns as soon as the event happens.
const wait = 3 * time.Minute

func TestDirectPublishAndSubmitRunToTheirResults(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)

	// Direct publish with plain JSON, as any NATS client would.
	f.SubmitJSON("default", "direct-1", "hello from a plain client")
	r := f.Follow("default", "direct-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 1, r.Final.Attempt)
	require.Contains(t, string(r.Lines[1].Data), "hello from a plain client")

	// The dispatcher's submit API assigns an id.
	rep, err := f.Client.Submit(context.Background(), protocol.Job{Prompt: "hello via the API", Tenant: "acme"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	require.NotEmpty(t, rep.ID)
	require.Equal(t, "fleet.query.acme."+rep.ID+".msg", rep.Subjects.Msg)
	r = f.Follow("acme", rep.ID, wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.True(t, slices.ContainsFunc(r.Statuses, func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateQueued && ev.JobSeq > 0
	}), "submit publishes a queued status carrying the submission's JobSeq")

	// A msgpack job is accepted when its Content-Type says so.
	body, err := msgpack.Marshal(protocol.Job{ID: "packed-1", Prompt: "msgpack prompt"})
	require.NoError(t, err)
	f.PublishJob("default", body, map[string]string{protocol.HeaderContentType: protocol.ContentTypeMsgpack})
	r = f.Follow("default", "packed-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)

	// Status and ls work from the index.
	fleettest.Eventually(t, wait, func() bool {
		st, err := f.Client.Status(context.Background(), protocol.QueryRef{ID: "direct-1"})
		return err == nil && st.Status != nil && st.Status.State == protocol.StateSucceeded
	}, "status of direct-1")
	fleettest.Eventually(t, wait, func() bool {
		ls, err := f.Client.List(context.Background(), protocol.ListRequest{State: protocol.StateSucceeded})
		return err == nil && len(ls.Queries) == 3
	}, "ls lists three succeeded queries")
}

func TestLinesAreByteIdenticalOrderedAndReplayable(t *testing.T) {
	t.Parallel()
	// The stand-in replays a real recorded session unchanged.
	rec, err := os.ReadFile("../standin/sessions/tool-use-mcp.ndjson")
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, AgentMod: func(c *agent.Config) {
		c.Command = append(c.Command, "--standin-replay=tool-use-mcp")
	}})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "replay-1", "replay")
	r := f.Follow("default", "replay-1", wait)
	lines := fleettest.RequireContiguous(t, r)
	require.Equal(t, string(rec), string(fleettest.JoinLines(lines)), "every line byte-identical and in order")
	require.Equal(t, protocol.StateSucceeded, r.Final.State)

	// Replay after the query finished: a late subscriber sees everything from seq 1.
	late := f.Follow("default", "replay-1", wait)
	require.Equal(t, fleettest.JoinLines(lines), fleettest.JoinLines(fleettest.RequireContiguous(t, late)))

	// The stored transcript is the same bytes.
	require.NoError(t, w.Journal.WaitPersisted(context.Background(), "default", "replay-1"))
	require.Equal(t, string(rec), string(f.Transcript(f.Objects, "default", "replay-1")))
}

func TestThreeTenantsAtOnce(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 4}).W)
	tenants := []string{"acme", "globex", "initech"}
	for _, tn := range tenants {
		for i := range 3 {
			// The same ids in every tenant: the dispatcher dedupes per tenant.
			rep, err := f.Client.Submit(context.Background(), protocol.Job{ID: "q" + fleettest.Itoa(i), Tenant: tn, Prompt: "/standin lines=20 tenant " + tn})
			require.NoError(t, err)
			require.Nil(t, rep.Error)
		}
	}
	for _, tn := range tenants {
		for i := range 3 {
			r := f.Follow(tn, "q"+fleettest.Itoa(i), wait)
			require.Equal(t, protocol.StateSucceeded, r.Final.State, "%s/q%d: %+v", tn, i, r.Final.Error)
			lines := fleettest.RequireContiguous(t, r)
			require.Len(t, lines, 23)
			require.Equal(t, protocol.StateSucceeded, r.Final.State)
			require.Equal(t, tn, r.Final.Tenant)
			require.Contains(t, string(lines[1]), "tenant "+tn, "no cross-tenant mix-up")
		}
	}
}

func TestWorkerKilledMidRunCompletesAsNextAttempt(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second})
	sdir := filepath.Join(f.Dir, "data")
	jdirA := t.TempDir()
	a := fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), jdirA, sdir)
	f.SubmitJSON("default", "kill-1", "/standin lines=400 delay=5ms")
	a.Expect(t, "started kill-1 1")
	// Let it write some lines, then kill the worker process outright.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", "kill-1"), 20)
	a.Kill(t)

	// Another worker takes it over after the ack deadline, as attempt 2.
	b := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, b.W)
	r := f.Follow("default", "kill-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Attempt)
	var seen bool
	for _, ev := range r.Statuses {
		if ev.State == protocol.StateRetrying && ev.Attempt == 2 {
			seen = true
		}
	}
	require.True(t, seen, "subscribers see the retrying status")
	var last uint64
	attempt := 1
	for _, l := range r.Lines {
		require.Greater(t, l.Seq, last, "Fleet-Seq never repeats and keeps increasing across attempts")
		last = l.Seq
		require.GreaterOrEqual(t, l.Attempt, attempt, "attempt 2's lines come after attempt 1's")
		attempt = l.Attempt
	}
	require.Equal(t, 2, attempt)
	require.True(t, protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data).IsResult())

	// The transcript is written from the stream (the archiver), without
	// the killed worker: it holds exactly what subscribers saw, in Fleet-Seq
	// order (attempt 2 wins any seq both wrote). A restart of the killed
	// worker on its journal (which holds nothing the stream lacks: lines it
	// never spilled were in the stream or died with it) changes nothing.
	fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), jdirA, sdir)
	var want [][]byte
	for _, l := range r.Lines {
		want = append(want, l.Data)
	}
	fleettest.Eventually(t, wait, func() bool {
		tr, err := f.Objects.Get(context.Background(), storage.TranscriptKey("default", "kill-1"))
		return err == nil && string(tr) == string(fleettest.JoinLines(want))
	}, "the transcript complete without the killed worker")
}

// waitMsgs waits until subject holds at least n messages in FLEET_QUERIES.
func waitMsgs(t testing.TB, ctx context.Context, js jetstream.JetStream, subject string, n uint64) {
	t.Helper()
	st, err := js.Stream(ctx, "FLEET_QUERIES")
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			return false
		}
		seq, _ := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64)
		return seq >= n
	}, "messages on "+subject)
}

func TestCancelRunningAndQueuedJobs(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 4)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "running-1", "/standin sleep=1h")
	f.SubmitJSON("default", "queued-1", "never runs")
	require.Equal(t, "running-1", <-started)

	// The queued job is cancelled through the API while it waits.
	rep, err := f.Client.Cancel(context.Background(), protocol.QueryRef{ID: "queued-1"})
	require.NoError(t, err)
	require.True(t, rep.OK)
	// The running one through its control subject, as any client could.
	require.NoError(t, f.NC.Publish(f.Names.QueryCtl("default", "running-1"), []byte(`{"op":"cancel"}`)))

	r := f.Follow("default", "running-1", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	last := protocol.ParseMessage(r.Lines[len(r.Lines)-1].Data)
	res, err := last.AsResult()
	require.NoError(t, err)
	require.Equal(t, protocol.ReasonCancelled, res.XFleet.Reason)

	q := f.Follow("default", "queued-1", wait)
	require.Equal(t, protocol.StateCancelled, q.Final.State)
	require.Len(t, q.Lines, 1, "only the synthetic result: the agent never started")
	select {
	case id := <-started:
		t.Fatalf("a cancelled queued job was started: %s", id)
	default:
	}
}

func TestMalformedJobsAreRejectedOnceAndNothingWedges(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	big := strings.Repeat("x", protocol.MaxPromptBytes+1)
	cases := []struct {
		name, tenant, id string // id readable => a failed status is expected
		body             string
		hdr              map[string]string
	}{
		{"not json", "default", "", `{{{`, nil},
		{"not an object", "default", "", `[1,2]`, nil},
		{"missing prompt", "default", "bad-1", `{"id":"bad-1"}`, nil},
		{"empty prompt", "default", "bad-2", `{"id":"bad-2","prompt":""}`, nil},
		{"prompt too large", "default", "bad-3", `{"id":"bad-3","prompt":"` + big + `"}`, nil},
		{"bad id", "default", "", `{"id":"-bad","prompt":"x"}`, nil},
		{"tenant mismatch", "default", "bad-4", `{"id":"bad-4","tenant":"other","prompt":"x"}`, nil},
		{"wrong type", "default", "bad-5", `{"id":"bad-5","prompt":"x","options":{"max_turns":"many"}}`, nil},
		{"bad range", "default", "bad-6", `{"id":"bad-6","prompt":"x","options":{"max_turns":0}}`, nil},
		{"bad permission mode", "default", "bad-7", `{"id":"bad-7","prompt":"x","options":{"permission_mode":"yolo"}}`, nil},
		{"env not allowed", "default", "bad-8", `{"id":"bad-8","prompt":"x","options":{"env":{"SECRET":"1"}}}`, nil},
		{"unknown content type", "default", "", `{"id":"bad-9","prompt":"x"}`, map[string]string{"Content-Type": "text/xml"}},
		{"bad msgpack", "default", "", "\xc1\xc1", map[string]string{"Content-Type": protocol.ContentTypeMsgpack}},
		{"invalid utf-8", "default", "bad-10", "{\"id\":\"bad-10\",\"prompt\":\"\xff\xfe\"}", nil},
	}
	for _, c := range cases {
		f.PublishJob(c.tenant, []byte(c.body), c.hdr)
	}
	// The next valid job succeeds.
	f.SubmitJSON("default", "good-1", "still works")
	r := f.Follow("default", "good-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)

	for _, c := range cases {
		if c.id == "" {
			continue
		}
		r := f.Follow(c.tenant, c.id, wait)
		require.Equal(t, protocol.StateFailed, r.Final.State, c.name)
		require.Equal(t, protocol.CodeInvalidJob, r.Final.Error.Code, c.name)
		require.NotEmpty(t, r.Final.Error.Message, c.name)
		require.Empty(t, r.Lines, "%s: an invalid job never runs", c.name)
		require.Len(t, r.Statuses, 1, "%s: rejected exactly once", c.name)
	}
	// Nothing left in the work queue and nothing redelivered.
	ctx := context.Background()
	cons, err := f.JS.Consumer(ctx, f.Names.JobsStream(), f.Names.Consumer())
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, "work queue drained")
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.NumRedelivered, "rejected jobs are never redelivered")
}

func TestFleetConcurrencyIsExact(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 3})
	var cur, peak atomic.Int64
	var mu sync.Mutex
	hooks := func(c *worker.Config) {
		c.Test.RunStarted = func(string, string, int) {
			n := cur.Add(1)
			mu.Lock()
			if n > peak.Load() {
				peak.Store(n)
			}
			mu.Unlock()
		}
		c.Test.RunEnded = func(string, string, int) { cur.Add(-1) }
	}
	w1 := f.StartWorker(fleettest.WorkerOpts{Slots: 4, Mod: hooks})
	w2 := f.StartWorker(fleettest.WorkerOpts{Slots: 4, Mod: hooks})
	fleettest.WaitReady(t, w1.W)
	fleettest.WaitReady(t, w2.W)
	const jobs = 12
	for i := range jobs {
		f.SubmitJSON("default", "c"+fleettest.Itoa(i), "/standin sleep=300ms")
	}
	for i := range jobs {
		r := f.Follow("default", "c"+fleettest.Itoa(i), wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State)
	}
	require.Equal(t, int64(3), peak.Load(), "MaxAckPending 3 with 2 workers x 4 Slots: exactly 3 at once")
}

func TestShutdownHandsRunningJobsBackAndLosesNothing(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	started := make(chan string, 8)
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 2, Grace: 200 * time.Millisecond, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) { started <- id }
	}})
	fleettest.WaitReady(t, a.W)
	f.SubmitJSON("default", "st-1", "/standin lines=200 delay=10ms")
	f.SubmitJSON("default", "st-2", "/standin lines=200 delay=10ms")
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	waitMsgs(t, ctx, f.JS, f.Names.QueryMsg("default", "st-1"), 5)
	require.NoError(t, a.W.Stop(ctx), "SIGTERM path: grace, then hand back")
	b := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, b.W)
	for _, id := range []string{"st-1", "st-2"} {
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State)
		require.Equal(t, 2, r.Final.Attempt, "handed back and continued as the next attempt")
		var last uint64
		for _, l := range r.Lines {
			require.Greater(t, l.Seq, last)
			last = l.Seq
		}
		require.NoError(t, b.Journal.WaitPersisted(ctx, "default", id))
		require.NoError(t, a.Journal.WaitPersisted(ctx, "default", id))
		tr := f.Transcript(f.Objects, "default", id)
		// The transcript holds every line the subscribers saw, in Fleet-Seq order.
		var want [][]byte
		for _, l := range r.Lines {
			want = append(want, l.Data)
		}
		require.Equal(t, string(fleettest.JoinLines(want)), string(tr))
	}
}

func TestStorageDownDuringRunTranscriptCompleteLater(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	flaky := storagetest.NewFlaky(f.Objects)
	flaky.SetDown(true)
	// The transcript writer (the archiver) and the worker both meet the
	// outage: the fleet's archiver is replaced by one on the flaky store.
	require.NoError(t, f.Arch.Stop(context.Background()))
	arch, err := archiver.New(archiver.Config{NC: f.NC, Names: f.Names, Store: flaky, Consumer: "flaky", Retry: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, arch.Start(context.Background()))
	t.Cleanup(func() { _ = arch.Stop(context.Background()) })
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Store: flaky})
	fleettest.WaitReady(t, w.W)
	f.SubmitJSON("default", "down-1", "/standin lines=50")
	r := f.Follow("default", "down-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "a storage outage never blocks the agent or the run")
	lines := fleettest.RequireContiguous(t, r)
	// The archiver has met the outage at least once for this query.
	fleettest.Eventually(t, wait, func() bool { return flaky.Failures() > 0 }, "the archiver tried storage")
	_, err = f.Objects.Get(context.Background(), storage.TranscriptKey("default", "down-1"))
	require.ErrorIs(t, err, storage.ErrNotFound, "nothing persisted while storage is down")
	flaky.SetDown(false)
	require.Equal(t, string(fleettest.JoinLines(lines)), string(f.Transcript(f.Objects, "default", "down-1")))
}

func TestHugeLineGoesOutAsPointerAndIsStoredWhole(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{ServerOpts: []natstest.Option{natstest.WithMaxPayload(256 << 10)}})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	requireLineStoredWhole(t, f, w, "huge-1", 3000000)
}

// TestLineAboveTheStreamsLimitGoesOutAsPointer: an operator created
// FLEET_QUERIES with a max message size below the server's max payload.
// A line between the two was refused by the stream on every try, and a
// later line stored meanwhile made the relay take it as stored: the line
// was lost. It now goes out as a pointer, like a line above the server's
// limit, and is stored whole.
func TestLineAboveTheStreamsLimitGoesOutAsPointer(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx := context.Background()
	st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 64 << 10
	_, err = f.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	requireLineStoredWhole(t, f, w, "stream-limit-1", 300000)
}

// requireLineStoredWhole runs a stand-in that writes a line of size bytes
// and checks that it reached the subject as a pointer, in order, and
// storage and the transcript whole.
func requireLineStoredWhole(t *testing.T, f *fleettest.Fleet, w *fleettest.Worker, id string, size int) {
	t.Helper()
	f.SubmitJSON("default", id, "/standin big="+strconv.Itoa(size))
	r := f.Follow("default", id, wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	fleettest.RequireContiguous(t, r)
	var ptr struct {
		Type  string `json:"type"`
		Seq   uint64 `json:"seq"`
		Bytes int    `json:"bytes"`
		Key   string `json:"key"`
	}
	var found bool
	for _, l := range r.Lines {
		if protocol.ParseMessage(l.Data).Type == "x_fleet_large_line" {
			require.NoError(t, json.Unmarshal(l.Data, &ptr))
			require.Equal(t, l.Seq, ptr.Seq)
			found = true
		}
	}
	require.True(t, found, "the line is replaced by a pointer on the subject")
	ctx := context.Background()
	require.NoError(t, w.Journal.WaitPersisted(ctx, "default", id))
	whole, err := f.Objects.Get(ctx, ptr.Key)
	require.NoError(t, err)
	require.Len(t, whole, ptr.Bytes)
	tr := f.Transcript(f.Objects, "default", id)
	require.True(t, bytes.Contains(tr, whole), "the transcript holds the full line")
}

func TestAgentNeverSeesWorkerSecrets(t *testing.T) {
	// t.Setenv: not parallel.
	t.Setenv("FLEET_CF_BRIDGE_TOKEN", "s3cr3t-7f1-bridge")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-7f1-aws")
	t.Setenv("CLOUDFLARE_API_TOKEN", "s3cr3t-7f1-cf")
	t.Setenv("ANTHROPIC_API_KEY", "s3cr3t-7f1-model-key")
	f := fleettest.New(t, fleettest.Opts{})
	// Even an operator who lists the model key does not give it to the
	// agent: it is the model gateway's (docs/gateway.md).
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2, EnvAllow: []string{"ANTHROPIC_API_KEY"}})
	fleettest.WaitReady(t, w.W)
	for _, name := range []string{"FLEET_CF_BRIDGE_TOKEN", "AWS_SECRET_ACCESS_KEY", "CLOUDFLARE_API_TOKEN", "ANTHROPIC_API_KEY"} {
		id := "env-" + strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		f.SubmitJSON("default", id, "/standin env="+name)
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State)
		all := string(fleettest.JoinLines(fleettest.RequireContiguous(t, r)))
		require.Contains(t, all, name+"=\"", "sanity: the stand-in printed the variable, empty")
		require.NotContains(t, all, "s3cr3t-7f1", "%s must never reach the agent", name)
	}
}

var _ = fleetcli.ExitOK

// A live worker whose job was redelivered elsewhere (it stopped
// heartbeating, e.g. a network partition) must not interleave its late
// output with the new attempt's: the new attempt's "retrying" status fences
// it.
func TestZombieAttemptIsFenced(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second})
	started := make(chan int, 4)
	// The zombie never heartbeats, so its job is redelivered after AckWait.
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Heartbeat = time.Hour
		c.Test.RunStarted = func(_, _ string, attempt int) { started <- attempt }
	}})
	fleettest.WaitReady(t, a.W)
	f.SubmitJSON("default", "zombie-1", "/standin lines=400 delay=25ms")
	require.Equal(t, 1, <-started)
	b := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, _ string, attempt int) { started <- attempt }
	}})
	fleettest.WaitReady(t, b.W)
	r := f.Follow("default", "zombie-1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.GreaterOrEqual(t, r.Final.Attempt, 2)
	// Once a later attempt's line appears, no earlier attempt's line follows.
	maxAttempt, last := 0, uint64(0)
	for _, l := range r.Lines {
		require.GreaterOrEqual(t, l.Attempt, maxAttempt, "a fenced attempt's line came after a later attempt's (seq %d)", l.Seq)
		maxAttempt = l.Attempt
		require.Greater(t, l.Seq, last)
		last = l.Seq
	}
	require.GreaterOrEqual(t, maxAttempt, 2)
}

// A cancel applies to the job it was sent for: an id re-submitted after its
// earlier run was cancelled runs normally, and a retried submit is deduped.
func TestCancelOfAnEarlierRunDoesNotCancelAResubmission(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{DedupeWindow: time.Second})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	ctx := context.Background()
	rep, err := f.Client.Submit(ctx, protocol.Job{ID: "again-1", Prompt: "/standin sleep=1h"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	again, err := f.Client.Submit(ctx, protocol.Job{ID: "again-1", Prompt: "/standin sleep=1h"})
	require.NoError(t, err)
	require.Nil(t, again.Error, "a retried submit is accepted")
	require.True(t, again.Duplicate, "and deduped")
	fleettest.Eventually(t, wait, func() bool {
		st, err := f.Client.Status(ctx, protocol.QueryRef{ID: "again-1"})
		return err == nil && st.Status != nil && st.Status.State == protocol.StateRunning
	}, "again-1 running")
	c, err := f.Client.Cancel(ctx, protocol.QueryRef{ID: "again-1"})
	require.NoError(t, err)
	require.True(t, c.OK)
	r := f.Follow("default", "again-1", wait)
	require.Equal(t, protocol.StateCancelled, r.Final.State)
	var queued int
	for _, ev := range r.Statuses {
		if ev.State == protocol.StateQueued {
			queued++
		}
	}
	require.Equal(t, 1, queued, "the retried submit published no second queued status")

	// Past the dedupe window the same id is a new submission; the old
	// cancel does not apply to it.
	fleettest.Eventually(t, wait, func() bool {
		rep, err := f.Client.Submit(ctx, protocol.Job{ID: "again-1", Prompt: "second run"})
		return err == nil && rep.Error == nil && !rep.Duplicate
	}, "the resubmission stored")
	fleettest.Eventually(t, wait, func() bool {
		st, err := f.Client.Status(ctx, protocol.QueryRef{ID: "again-1"})
		return err == nil && st.Status != nil && st.Status.State == protocol.StateSucceeded
	}, "the resubmission succeeds")
}
