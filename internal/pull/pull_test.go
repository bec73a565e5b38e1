package pull_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/pull"
)

const wait = 2 * time.Minute

// next reads the next job, taking status messages into account on the way.
func next(t *testing.T, p *pull.Puller) jetstream.Msg {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case m := <-p.Msgs():
			if pull.IsStatus(m) {
				require.NoError(t, p.Status(m))
				continue
			}
			return p.Job(m)
		case <-timeout:
			t.Fatal("no job delivered")
		}
	}
}

// TestAskDeliversAtMostN: one request for n jobs delivers n of the m
// queued, no more until the next request; acks settle them on the server,
// a Nak with delay hands one back, an expired request reports what it did
// not fill.
func TestAskDeliversAtMostN(t *testing.T) {
	_, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>"}, Retention: jetstream.WorkQueuePolicy})
	require.NoError(t, err)
	cons, err := js.CreateConsumer(ctx, "JOBS", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	require.NoError(t, err)
	for i := range 5 {
		_, err := js.Publish(ctx, "jobs.t", []byte(strconv.Itoa(i)))
		require.NoError(t, err)
	}

	p, err := pull.New(nc, "JOBS", "w", 16, 2*time.Second, 500*time.Millisecond)
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.Ask(2))
	require.Equal(t, 2, p.Pending())
	a, b := next(t, p), next(t, p)
	require.Equal(t, "0", string(a.Data()))
	require.Equal(t, "1", string(b.Data()))
	require.Equal(t, 0, p.Pending())
	md, err := a.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(1), md.NumDelivered)
	require.Equal(t, "JOBS", md.Stream)

	require.NoError(t, a.DoubleAck(ctx))
	require.ErrorIs(t, a.Ack(), jetstream.ErrMsgAlreadyAckd)
	require.NoError(t, b.InProgress())
	require.NoError(t, b.NakWithDelay(10*time.Millisecond))
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(4), info.NumPending+uint64(info.NumAckPending), "one acked, four left")

	// Nothing more arrives without a request: ask for 3 of the 4 left
	// (the nak'ed one comes back among them, as its second delivery).
	require.NoError(t, p.Ask(3))
	delivered := map[string]uint64{}
	for range 3 {
		m := next(t, p)
		md, err := m.Metadata()
		require.NoError(t, err)
		delivered[string(m.Data())] = md.NumDelivered
		require.NoError(t, m.Ack())
	}
	require.Len(t, delivered, 3)

	// One left: a request for 2 fills 1 and, at its expiry, reports 1 unfilled.
	require.NoError(t, p.Ask(2))
	require.NoError(t, next(t, p).Ack())
	require.Equal(t, 1, p.Pending())
	deadline := time.After(wait)
	for p.Pending() > 0 {
		select {
		case m := <-p.Msgs():
			require.True(t, pull.IsStatus(m), "no sixth job")
			require.NoError(t, p.Status(m))
		case <-deadline:
			t.Fatal("the request's expiry was not reported")
		}
	}
}

// TestLostRequestsAreForgotten: requests with no answer at all for two
// heartbeats are forgotten, so the caller asks again.
func TestLostRequestsAreForgotten(t *testing.T) {
	_, nc, _ := natstest.RunJetStream(t)
	// No such consumer: the request is never answered.
	p, err := pull.New(nc, "NONE", "none", 4, time.Minute, 100*time.Millisecond)
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.Ask(3))
	require.False(t, p.Lost(time.Now()))
	require.True(t, p.Lost(time.Now().Add(time.Second)))
	require.Equal(t, 0, p.Pending())
}
