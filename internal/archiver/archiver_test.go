package archiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/archiver"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { fleettest.MainNoLeaks(m) }

// wait bounds every wait for an event (generous: `make test` runs all
// packages at once on 2 cores).
const wait = 2 * time.Minute

// TestLostWorkerTranscriptIsCompleted: a worker is SIGKILLed mid-run and
// never comes back, so the tail it journaled but had not flushed never
// reaches storage from it. Another worker finishes the query; the stored
// transcript must still hold every line the stream holds.
func TestLostWorkerTranscriptIsCompleted(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{AckWait: 2 * time.Second})
	root := f.Objects.(*storage.FS).Root()
	lost := fleettest.StartWorkerProcess(t, f.Srv.ClientURL(), filepath.Join(t.TempDir(), "journal"), root)

	lines := make(chan *nats.Msg, 4096)
	sub, err := f.NC.ChanSubscribe(f.Names.QueryMsg("default", "lost1"), lines)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	f.SubmitJSON("default", "lost1", "/standin lines=400 delay=5ms")
	lost.Expect(t, "started lost1 1")
	for range 60 { // the run is well under way, its journal flushing
		select {
		case <-lines:
		case <-time.After(wait):
			t.Fatal("timed out waiting for the lost worker's lines")
		}
	}
	lost.Kill(t) // and never restarted

	f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	r := f.Follow("default", "lost1", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Greater(t, r.Final.Attempt, 1)
	want := fleettest.JoinLines(fleettest.RequireContiguous(t, r))

	var got []byte
	fleettest.Eventually(t, wait, func() bool {
		got, _ = f.Objects.Get(context.Background(), storage.TranscriptKey("default", "lost1"))
		return bytes.Equal(got, want)
	}, "the archiver to write the transcript from the stream: every line of the stream, the lost worker's included")
}

// gatedStore blocks every call on one query's keys until open is closed.
type gatedStore struct {
	storage.Store
	prefix  string
	open    chan struct{}
	blocked chan struct{} // closed when the first call is held
	once    sync.Once
}

func (g *gatedStore) gate(key string) {
	if strings.HasPrefix(key, g.prefix) {
		g.once.Do(func() { close(g.blocked) })
		<-g.open
	}
}

func (g *gatedStore) Get(ctx context.Context, key string) ([]byte, error) {
	g.gate(key)
	return g.Store.Get(ctx, key)
}

func (g *gatedStore) List(ctx context.Context, prefix string) ([]string, error) {
	g.gate(prefix)
	return g.Store.List(ctx, prefix)
}

func (g *gatedStore) Put(ctx context.Context, key string, v []byte) error {
	g.gate(key)
	return g.Store.Put(ctx, key, v)
}

// publishQuery puts a finished query on the stream as a worker would: its
// lines on .msg and a terminal status; it returns the transcript they make.
func publishQuery(t *testing.T, f *fleettest.Fleet, id string, n int) []byte {
	t.Helper()
	ctx := context.Background()
	var want []byte
	for seq := 1; seq <= n; seq++ {
		line := fmt.Appendf(nil, `{"type":"assistant","n":%d}`, seq)
		m := nats.NewMsg(f.Names.QueryMsg("default", id))
		m.Data = line
		m.Header.Set(protocol.HeaderSeq, strconv.Itoa(seq))
		m.Header.Set(protocol.HeaderAttempt, "1")
		_, err := f.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		want = append(append(want, line...), '\n')
	}
	ev, err := json.Marshal(protocol.StatusEvent{V: 1, ID: id, Tenant: "default", State: protocol.StateSucceeded, Attempt: 1, At: time.Now()})
	require.NoError(t, err)
	_, err = f.JS.Publish(ctx, f.Names.QueryStatus("default", id), ev)
	require.NoError(t, err)
	return want
}

// TestStuckRepairDoesNotHoldUpOthers: one query's repair hangs (its storage
// calls block, as a read across a server restart or a slow bucket would);
// the transcripts of queries that finish after it are still written.
func TestStuckRepairDoesNotHoldUpOthers(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	// This archiver replaces the fleet's, with a durable consumer of its
	// own (events the stopped one had pulled are not held up with it).
	require.NoError(t, f.Arch.Stop(context.Background()))
	gated := &gatedStore{Store: f.Objects, prefix: storage.QueryPrefix("default", "stuck"), open: make(chan struct{}), blocked: make(chan struct{})}
	a, err := archiver.New(archiver.Config{NC: f.NC, Names: f.Names, Store: gated, Consumer: "gated", Delay: 10 * time.Millisecond, Logger: &f.Logger})
	require.NoError(t, err)
	require.NoError(t, a.Start(context.Background()))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		require.NoError(t, a.Stop(ctx))
	}()
	defer close(gated.open) // before Stop: the stuck repair finishes

	publishQuery(t, f, "stuck", 3)
	select {
	case <-gated.blocked:
	case <-time.After(wait):
		t.Fatal("the stuck query's repair never started")
	}
	want := publishQuery(t, f, "next", 5)
	fleettest.Eventually(t, wait, func() bool {
		got, _ := f.Objects.Get(context.Background(), storage.TranscriptKey("default", "next"))
		return bytes.Equal(got, want)
	}, "the transcript of a query finished after a stuck repair to be written from the stream")
}

// TestReadersGiveTheirConsumersBack: the archiver's read (batched direct
// gets: no consumer at all), a tail and a history read leave no consumer
// behind, so finished queries do not pile consumers up on FLEET_QUERIES
// (nats-server allows 1,000 per stream by default; the 1,000-job soak ran
// into it).
func TestReadersGiveTheirConsumersBack(t *testing.T) {
	f := fleettest.New(t, fleettest.Opts{})
	rd := transcript.NewReader(f.NC, f.Names, f.Objects)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	consumers := func() int {
		st, err := f.JS.Stream(ctx, f.Names.QueriesStream())
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}
	before := consumers()
	for i := range 3 {
		id := "q" + strconv.Itoa(i)
		want := publishQuery(t, f, id, 5)
		require.NoError(t, rd.Merge(ctx, "default", id))
		got, err := f.Objects.Get(ctx, storage.TranscriptKey("default", id))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
		final, err := f.Client.Follow(ctx, "default", id, false, fleetapi.Follower{})
		require.NoError(t, err)
		require.NotNil(t, final)
		f.History("default", id)
	}
	require.Equal(t, before, consumers(), "every reader deleted its consumer")
}
