package worker

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
)

type memLog struct{ lines [][]byte }

func (m *memLog) Append(_ uint64, line []byte) error {
	m.lines = append(m.lines, line)
	return nil
}

func (m *memLog) AppendWhole(seq uint64, line []byte) error { return m.Append(seq, line) }

func (m *memLog) Ack(uint64) {}

// TestRelayRunEndsWithItsContext: the publisher goroutine returns once its
// context ends, even when the relay was never closed and has nothing queued
// (it used to wait on its sync.Cond for good).
func TestRelayRunEndsWithItsContext(t *testing.T) {
	_, _, js := natstest.RunJetStream(t)
	r := newRelay(&relay{
		js: js, subject: "fleet.q.default.q1.msg", tenant: "default", id: "q1", attempt: 1,
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
