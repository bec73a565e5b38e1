package worker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

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
	r := newRelay(&relay{
		pub: jspub.New(nc), nc: nc, subject: "fleet.q.default.q1.msg", tenant: "default", id: "q1", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(nil, 1, nil), log: zerolog.Nop(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.start(ctx)
	cancel()
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("relay.run still running a minute after its context ended")
	}
	// An emit after the publisher stopped does not wait for room.
	r.maxQueued = 1
	require.NoError(t, r.emit([]byte(`{"type":"assistant"}`)))
	require.NoError(t, r.emit([]byte(`{"type":"assistant"}`)))
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
	r := newRelay(&relay{
		pub: jspub.New(nc), nc: nc, stream: "Q", subject: "q.t.x.msg", tenant: "t", id: "x", attempt: 1,
		maxPayload: 1 << 20, journal: &memLog{}, metrics: NewMetrics(nil, 1, nil), log: zerolog.Nop(),
		window: 16, timeout: 200 * time.Millisecond,
		fence: fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: "Q", Subject: "q.t.x.status"}),
	})
	r.start(ctx)
	defer r.shutdown()
	for i := range lines {
		require.NoError(t, r.emit([]byte(`{"type":"assistant","n":`+strconv.Itoa(i+1)+`}`)))
	}
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, r.flush(fctx))

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
