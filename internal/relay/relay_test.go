package relay

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/jspub"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

type memLog struct{ lines [][]byte }

func (m *memLog) Append(_ uint64, line []byte) error {
	m.lines = append(m.lines, line)
	return nil
}

func (m *memLog) AppendWhole(seq uint64, line []byte) error { return m.Append(seq, line) }

func (m *memLog) AppendOwned(seq uint64, line []byte) error { return m.Append(seq, line) }

func (m *memLog) Ack(uint64) {}

// TestRelayRunEndsWithItsContext: the publisher goroutine returns once its
// context ends, even when the relay was never closed and has nothing queued
// (it used to wait on its sync.Cond for good).
func TestRelayRunEndsWithItsContext(t *testing.T) {
	_, nc, _ := natstest.RunJetStream(t)
	r := newRelay(&Relay{
		pub: jspub.New(nc), nc: nc, subject: "fleet.q.default.q1.msg", tenant: "default", id: "q1", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(), log: zerolog.Nop(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.Start(ctx)
	cancel()
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("relay.run still running a minute after its context ended")
	}
	// An emit after the publisher stopped does not wait for room.
	r.maxQueued = 1
	require.NoError(t, r.Emit([]byte(`{"type":"assistant"}`)))
	require.NoError(t, r.Emit([]byte(`{"type":"assistant"}`)))
}

// TestRelayLinesWhoseAcksNeverComeAreReadBack: on a stream that stores
// lines but never acknowledges them (NoAck, as when the PubAck is lost with
// a dying leader), each line's wait ends at the relay's timeout; the relay
// then reads the stream back and goes on from the first line not stored.
// Every line is stored once, in order, and flush succeeds.
func TestRelayLinesWhoseAcksNeverComeAreReadBack(t *testing.T) {
	_, nc, js := natstest.RunJetStream(t)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, NoAck: true})
	require.NoError(t, err)
	const lines = 50
	r := newRelay(&Relay{
		pub: jspub.New(nc), nc: nc, stream: "Q", subject: "q.t.x.msg", tenant: "t", id: "x", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(), log: zerolog.Nop(),
		window: 16, timeout: 200 * time.Millisecond,
		fence: fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: "Q", Subject: "q.t.x.status"}),
	})
	r.Start(ctx)
	defer r.Shutdown()
	for i := range lines {
		require.NoError(t, r.Emit([]byte(`{"type":"assistant","n":`+strconv.Itoa(i+1)+`}`)))
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, r.Flush(fctx))

	info, err := js.Stream(ctx, "Q")
	require.NoError(t, err)
	got := info.CachedInfo().State.Msgs
	require.Equal(t, uint64(lines), got, "each line stored once")
	for seq := uint64(1); seq <= lines; seq++ {
		m, err := info.GetMsg(ctx, seq)
		require.NoError(t, err)
		require.Equal(t, strconv.FormatUint(seq, 10), m.Header.Get(protocol.HeaderSeq), "in order")
	}
}

// TestRelayLineLostWithAConnectionIsSentAgain: line 1 went out on a
// connection that then broke and was lost with it (never stored, never
// acknowledged); line 2 went out on the next connection and was stored.
// The stream's last line is then 2 although 1 is missing, so neither line
// 2's acknowledgement nor the read back may mark line 1 stored: recover
// sends both again (the stream drops line 2's copy), until line 1 is
// acknowledged. Before, recover took line 2 as proof of line 1 and the
// journal forgot it: a line lost for good.
func TestRelayLineLostWithAConnectionIsSentAgain(t *testing.T) {
	srv, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	r := newRelay(&Relay{
		pub: jspub.New(nc), nc: nc, stream: "Q", subject: "q.t.x.msg", tenant: "t", id: "x", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(), log: zerolog.Nop(),
		timeout: 200 * time.Millisecond,
		fence:   fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: "Q", Subject: "q.t.x.status"}),
	})
	line := func(seq uint64) outMsg {
		return outMsg{seq: seq, data: []byte(`{"n":` + strconv.FormatUint(seq, 10) + `}`)}
	}

	// Line 1 "lost": it goes where no stream stores it and a subscriber
	// never answers, as if the connection had died with it.
	void, err := nc.SubscribeSync("void.>")
	require.NoError(t, err)
	defer func() { _ = void.Unsubscribe() }()
	lost := nats.NewMsg("void.1")
	lost.Data = line(1).data
	a1, err := r.pub.Publish(lost, r.acked)
	require.NoError(t, err)
	first := flight{m: line(1), a: a1, sent: time.Now(), conn: nc.Stats().Reconnects}

	// The connection breaks; the client reconnects.
	natstest.Restart(t, srv)
	require.Eventually(t, func() bool { return nc.IsConnected() && nc.Stats().Reconnects == 1 }, time.Minute, 10*time.Millisecond)
	second, err := r.send(line(2))
	require.NoError(t, err)
	require.NotEqual(t, first.conn, second.conn, "line 2 went out on the new connection")

	rest, inflight := r.recover(ctx, errAckTimeout, []flight{first, second}, nil)
	require.Empty(t, inflight)
	require.Equal(t, []uint64{1, 2}, seqs(rest), "every line after the last one acknowledged in order is sent again")
	require.Equal(t, uint64(0), r.storedSeq())

	// A later failure (NATS away again) reads the stream back, whose last
	// line is 2: that read must not vouch for line 1 either.
	rest, _ = r.recover(ctx, nats.ErrDisconnected, nil, rest)
	require.Equal(t, []uint64{1, 2}, seqs(rest))

	// Sent again in order, both are acknowledged (2 as a duplicate), and
	// the stream holds each line once.
	for _, m := range rest {
		f, err := r.send(m)
		require.NoError(t, err)
		require.NoError(t, r.await(ctx, f))
		require.NoError(t, f.a.Err)
		r.setStoredFreed(m.seq, 0)
	}
	require.Zero(t, r.gapFrom, "line 1 acknowledged: the read back can be trusted again")
	st, err := js.Stream(ctx, "Q")
	require.NoError(t, err)
	require.Equal(t, uint64(2), st.CachedInfo().State.Msgs)
	var stored []string
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		stored = append(stored, m.Header.Get(protocol.HeaderSeq))
	}
	require.Equal(t, []string{"2", "1"}, stored, "line 2 first (from the new connection), then line 1 sent again")
}

// TestRelaySendNoticesTheReconnectBuffer: a line published while the
// connection is down waits in the client's reconnect buffer, to be sent
// after whatever the old connection lost; send marks its flight so.
func TestRelaySendNoticesTheReconnectBuffer(t *testing.T) {
	srv, nc, js := natstest.RunJetStream(t)
	r := newRelay(&Relay{
		pub: jspub.New(nc), nc: nc, stream: "Q", subject: "q.t.x.msg", tenant: "t", id: "x", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(), log: zerolog.Nop(),
		fence: fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: "Q", Subject: "q.t.x.status"}),
	})
	f, err := r.send(outMsg{seq: 1, data: []byte(`{}`)})
	require.NoError(t, err)
	require.False(t, f.buffered)
	srv.Shutdown()
	require.Eventually(t, func() bool { return !nc.IsConnected() }, time.Minute, 10*time.Millisecond)
	g, err := r.send(outMsg{seq: 2, data: []byte(`{}`)})
	require.NoError(t, err, "nats.go keeps it for the next connection")
	require.True(t, g.buffered)
	require.False(t, oneConnection([]flight{f, g}))
	require.True(t, oneConnection([]flight{f}))
}

func seqs(ms []outMsg) []uint64 {
	out := make([]uint64, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.seq)
	}
	return out
}

// TestRelayLineRefusedThenALaterOneStoredIsSentAgain: the stream refuses
// line 2 (above its max message size, lowered while the run goes on) but
// stores line 3, sent before the refusal came back. Line 3's
// acknowledgement and the read back must not mark line 2 stored: it goes
// again, after a pause, until the stream takes it (the limit is raised
// again), and the stream ends with every line. Before, line 2 was lost.
func TestRelayLineRefusedThenALaterOneStoredIsSentAgain(t *testing.T) {
	r, js, m := groupRelay(t, 2048)
	r.groupMin = 0 // one acknowledgement per line
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := `{"pad":"` + strings.Repeat("x", 4096) + `"}`
	// All three are queued before the publisher starts, so line 3 goes
	// out before line 2's refusal is back.
	for _, l := range []string{`{"n":1}`, big, `{"n":3}`} {
		require.NoError(t, r.Emit([]byte(l)))
	}
	r.Start(ctx)
	defer r.Shutdown()
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.PublishErrors) > 0 }, time.Minute, time.Millisecond)
	raiseMaxMsgSize(ctx, t, js)
	require.NoError(t, r.Flush(ctx))
	requireStoredOnce(t, js, 3)
}

// raiseMaxMsgSize lifts stream Q's max message size.
func raiseMaxMsgSize(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	st, err := js.Stream(ctx, "Q")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 0
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
}

// groupRelay is a relay on stream Q that sends groups of 16 or more lines.
func groupRelay(t *testing.T, maxMsgSize int32) (*Relay, jetstream.JetStream, *Metrics) {
	t.Helper()
	_, nc, js := natstest.RunJetStream(t)
	_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "Q", Subjects: []string{"q.>"}, Duplicates: time.Minute, MaxMsgSize: maxMsgSize, AllowDirect: true,
	})
	require.NoError(t, err)
	m := NewMetrics()
	r := newRelay(&Relay{
		pub: jspub.New(nc), nc: nc, stream: "Q", subject: "q.t.x.msg", tenant: "t", id: "x", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: m, log: zerolog.Nop(), timeout: time.Second,
		fence:  fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: "Q", Subject: "q.t.x.status"}),
		direct: directget.New(nc), groupMin: 16, window: 64,
	})
	return r, js, m
}

// requireStoredOnce checks that stream Q holds lines 1..n of q.t.x.msg,
// each once, and returns their Fleet-Seqs in stream order.
func requireStoredOnce(t *testing.T, js jetstream.JetStream, n int) []uint64 {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, "Q")
	require.NoError(t, err)
	var order []uint64
	seen := map[uint64]bool{}
	for seq := uint64(1); seq <= st.CachedInfo().State.LastSeq; seq++ {
		msg, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		fs, err := strconv.ParseUint(msg.Header.Get(protocol.HeaderSeq), 10, 64)
		require.NoError(t, err)
		require.False(t, seen[fs], "line %d stored twice", fs)
		seen[fs] = true
		order = append(order, fs)
	}
	require.Len(t, seen, n, "every line stored")
	return order
}

// TestRelayGroupsStoreEveryLine: lines queued faster than they are stored
// go out in groups, one acknowledgement and one count each; every line is
// stored once, in order.
func TestRelayGroupsStoreEveryLine(t *testing.T) {
	r, js, m := groupRelay(t, 0)
	const lines = 1000
	for i := range lines {
		require.NoError(t, r.Emit([]byte(`{"n":`+strconv.Itoa(i+1)+`}`)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.Start(ctx)
	defer r.Shutdown()
	require.NoError(t, r.Flush(ctx))
	order := requireStoredOnce(t, js, lines)
	for i, fs := range order {
		require.Equal(t, uint64(i+1), fs, "in order")
	}
	require.GreaterOrEqual(t, testutil.ToFloat64(m.LineGroups.WithLabelValues("stored")), 1.0)
	require.Zero(t, testutil.ToFloat64(m.LineGroups.WithLabelValues("resent")))
}

// TestRelayGroupWithARefusedLineIsSentAgain: the stream refuses line 20 of
// a group (above its max message size) without a word, since it had no
// reply subject, and stores the group's last line, whose acknowledgement
// comes back. The count finds a line missing: the group goes again one
// acknowledgement each, line 20 waits until the stream takes it (the limit
// is raised), and the stream ends with every line once. Trusting the
// acknowledgement alone lost line 20.
func TestRelayGroupWithARefusedLineIsSentAgain(t *testing.T) {
	r, js, m := groupRelay(t, 2048)
	const lines = 40
	for i := range lines {
		l := `{"n":` + strconv.Itoa(i+1) + `}`
		if i+1 == 20 {
			l = `{"pad":"` + strings.Repeat("x", 4096) + `"}`
		}
		require.NoError(t, r.Emit([]byte(l)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.Start(ctx)
	defer r.Shutdown()
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.LineGroups.WithLabelValues("resent")) > 0 }, time.Minute, time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.PublishErrors) > 0 }, time.Minute, time.Millisecond, "line 20 refused again, alone")
	raiseMaxMsgSize(ctx, t, js)
	require.NoError(t, r.Flush(ctx))
	requireStoredOnce(t, js, lines)
}
