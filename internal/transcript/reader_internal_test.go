package transcript

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/jsretry"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// readerFixture is a FLEET_QUERIES-like stream holding one query's lines:
// n lines over two attempts (the second from half way), a large-line
// pointer at line n-10 whose line is in storage, and another query's lines
// interleaved with them.
type readerFixture struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  protocol.Names
	store  storage.Store
	want   []storage.StreamLine
	large  []byte
	stream string
}

func newReaderFixture(t *testing.T, n int, cfg func(*jetstream.StreamConfig)) *readerFixture {
	_, nc, js := natstest.RunJetStream(t)
	return fillReaderFixture(t, nc, js, n, cfg)
}

func fillReaderFixture(t *testing.T, nc *nats.Conn, js jetstream.JetStream, n int, cfg func(*jetstream.StreamConfig)) *readerFixture {
	f := &readerFixture{nc: nc, js: js, names: protocol.NewNames("")}
	f.stream = f.names.QueriesStream()
	sc := jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.names.QueriesWildcard()}, AllowDirect: true}
	if cfg != nil {
		cfg(&sc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// On a loaded cluster a create's reply can be lost: provisioning's retry.
	require.NoError(t, jsretry.Do(ctx, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, sc)
		return err
	}))
	store, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	f.store = store
	f.large = []byte(`{"type":"assistant","text":"` + strings.Repeat("L", 4096) + `"}`)
	pub, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	require.NoError(t, err)
	for seq := 1; seq <= n; seq++ {
		attempt := 1
		if seq > n/2 {
			attempt = 2
		}
		data := []byte(`{"type":"assistant","n":` + strconv.Itoa(seq) + `}`)
		want := data
		if seq == n-10 {
			key := storage.LineKey("t", "q", uint64(seq))
			require.NoError(t, store.Put(ctx, key, f.large))
			data = []byte(`{"type":"x_fleet_large_line","seq":` + strconv.Itoa(seq) + `,"bytes":` + strconv.Itoa(len(f.large)) + `,"key":"` + key + `"}`)
			want = f.large
		}
		f.want = append(f.want, storage.StreamLine{Seq: uint64(seq), Attempt: attempt, Data: want})
		for _, q := range []string{"q", "other"} {
			m := nats.NewMsg(f.names.QueryMsg("t", q))
			m.Data = data
			m.Header.Set(protocol.HeaderSeq, strconv.Itoa(seq))
			m.Header.Set(protocol.HeaderAttempt, strconv.Itoa(attempt))
			// A full window of publishes in flight (a loaded cluster
			// acknowledges slowly) says so with an error: wait for room.
			for {
				_, err := pub.PublishMsgAsync(m)
				if err == nil {
					break
				}
				require.ErrorIs(t, err, jetstream.ErrTooManyStalledMsgs)
				select {
				case <-pub.PublishAsyncComplete():
				case <-time.After(time.Minute):
					t.Fatal("publishes in flight not acknowledged in a minute")
				}
			}
		}
	}
	select {
	case <-pub.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("lines not stored")
	}
	return f
}

// reader is the archiver's Reader (consumer read-back) if consume, else a
// worker's (direct gets only).
func (f *readerFixture) reader(consume bool) *Reader {
	r := NewReader(f.nc, f.names, f.store)
	if consume {
		r.js = f.js
	}
	return r
}

// count counts the messages on subject until the test ends.
func count(t *testing.T, nc *nats.Conn, subject string) *atomic.Int64 {
	var n atomic.Int64
	sub, err := nc.Subscribe(subject, func(*nats.Msg) { n.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return &n
}

// consumers is how many consumers the stream has.
func (f *readerFixture) consumers(t *testing.T) int {
	info, err := f.js.Stream(context.Background(), f.stream)
	require.NoError(t, err)
	return info.CachedInfo().State.Consumers
}

// TestReaderLongTranscriptThroughOneConsumer: past directLines lines the
// archiver's Reader reads the rest through one consumer, which it deletes,
// instead of a direct get per page (whose replies carry six added headers
// per line); the lines are the same, in order, pointers resolved.
func TestReaderLongTranscriptThroughOneConsumer(t *testing.T) {
	const n = 2500
	f := newReaderFixture(t, n, nil)
	ctx := context.Background()
	gets := count(t, f.nc, "$JS.API.DIRECT.GET."+f.stream)
	created := count(t, f.nc, "$JS.EVENT.ADVISORY.CONSUMER.CREATED."+f.stream+".*")
	deleted := count(t, f.nc, "$JS.EVENT.ADVISORY.CONSUMER.DELETED."+f.stream+".*")

	direct, complete, err := f.reader(false).Lines(ctx, "t", "q")
	require.NoError(t, err)
	require.True(t, complete)
	require.Equal(t, f.want, direct)
	require.Equal(t, int64(3), gets.Load(), "a worker's Reader: a direct get per 1,000 lines")
	require.Zero(t, created.Load())

	gets.Store(0)
	lines, complete, err := f.reader(true).Lines(ctx, "t", "q")
	require.NoError(t, err)
	require.True(t, complete)
	require.Equal(t, f.want, lines, "every line once, in order, the large one resolved")
	require.Equal(t, int64(1), gets.Load(), "one direct get for the first lines")
	require.Eventually(t, func() bool { return created.Load() == 1 && deleted.Load() == 1 }, time.Minute, 10*time.Millisecond,
		"one consumer made and deleted (created %d, deleted %d)", created.Load(), deleted.Load())
	require.Zero(t, f.consumers(t))
}

// TestReaderShortTranscriptMakesNoConsumer: up to directLines lines, and
// one past it, the archiver's Reader reads them all (at the edge, one line
// through a consumer).
func TestReaderShortTranscriptMakesNoConsumer(t *testing.T) {
	for _, n := range []int{directLines, directLines + 1} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			f := newReaderFixture(t, n, nil)
			created := count(t, f.nc, "$JS.EVENT.ADVISORY.CONSUMER.CREATED."+f.stream+".*")
			lines, complete, err := f.reader(true).Lines(context.Background(), "t", "q")
			require.NoError(t, err)
			require.True(t, complete)
			require.Equal(t, f.want, lines)
			require.NoError(t, f.nc.Flush())
			if n == directLines {
				require.Zero(t, created.Load(), "no consumer for a short transcript")
			} else {
				require.Eventually(t, func() bool { return created.Load() == 1 }, time.Minute, 10*time.Millisecond)
			}
			require.Zero(t, f.consumers(t))
		})
	}
}

// TestReaderFallsBackToDirectGets: when the stream takes no more consumers
// (its limit, or a permission), the archiver's Reader reads the rest with
// direct gets and still gets every line.
func TestReaderFallsBackToDirectGets(t *testing.T) {
	f := newReaderFixture(t, 1500, func(c *jetstream.StreamConfig) { c.MaxConsumers = 1 })
	ctx := context.Background()
	_, err := f.js.CreateOrUpdateConsumer(ctx, f.stream, jetstream.ConsumerConfig{Durable: "index", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	lines, complete, err := f.reader(true).Lines(ctx, "t", "q")
	require.NoError(t, err)
	require.True(t, complete)
	require.Equal(t, f.want, lines)
	require.Equal(t, 1, f.consumers(t))
}

// TestReaderLongTranscriptOnACluster: on a 3-node cluster with an R3
// stream (direct gets may be answered by any replica; the read-back
// consumer has one replica, in memory, on an R3 stream), the archiver's
// Reader gets every line and leaves no consumer behind.
func TestReaderLongTranscriptOnACluster(t *testing.T) {
	c := natstest.RunCluster(t, natstest.ClusterOptions(t, 3))
	nc, js := c.Connect(t)
	f := fillReaderFixture(t, nc, js, 1200, func(c *jetstream.StreamConfig) { c.Replicas = 3 })
	created := count(t, f.nc, "$JS.EVENT.ADVISORY.CONSUMER.CREATED."+f.stream+".*")
	// A replica answering a direct get may not have the last lines yet:
	// the archiver reads again then (it compares with the terminal
	// status), and so does this test.
	// A young R3 stream may also answer no direct get for a moment (its
	// replicas still catching up under load: "no responders"); the
	// archiver retries such a read, and so does this test.
	var lastErr error
	if !assert.Eventually(t, func() bool {
		lines, complete, err := f.reader(true).Lines(context.Background(), "t", "q")
		if err != nil {
			lastErr = err
			return false
		}
		return complete && len(lines) == len(f.want) && assert.ObjectsAreEqual(f.want, lines)
	}, 2*time.Minute, 50*time.Millisecond, "every line read back") {
		t.Fatalf("the last read's error: %v", lastErr)
	}
	require.Positive(t, created.Load(), "read through a consumer")
	require.Eventually(t, func() bool { return f.consumers(t) == 0 }, time.Minute, 50*time.Millisecond, "no consumer left")
}
