package fence_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	me := fence.Owner{JobSeq: 10, Attempt: 2, Worker: "w1"}
	ev := func(state protocol.State, jobSeq uint64, attempt int, worker string) *protocol.StatusEvent {
		return &protocol.StatusEvent{State: state, JobSeq: jobSeq, Attempt: attempt, Worker: worker}
	}
	cases := []struct {
		name string
		last *protocol.StatusEvent
		want fence.Verdict
	}{
		{"nothing on record", nil, fence.Proceed},
		{"queued by the dispatcher", ev(protocol.StateQueued, 10, 0, ""), fence.Proceed},
		{"an earlier attempt running", ev(protocol.StateRunning, 10, 1, "w0"), fence.Proceed},
		{"own status", ev(protocol.StateRunning, 10, 2, "w1"), fence.Proceed},
		{"an earlier submission ended", ev(protocol.StateSucceeded, 9, 3, "w0"), fence.Proceed},
		{"an earlier submission's zombie", ev(protocol.StateRunning, 9, 1, "w0"), fence.Proceed},
		{"terminal, this submission", ev(protocol.StateSucceeded, 10, 1, "w0"), fence.Finished},
		{"dead-lettered by the dispatcher", ev(protocol.StateFailed, 10, 2, "dispatcher"), fence.Finished},
		{"terminal without job seq", ev(protocol.StateCancelled, 0, 1, "w0"), fence.Finished},
		{"a later attempt", ev(protocol.StateRetrying, 10, 3, "w2"), fence.Superseded},
		{"the same attempt, someone else", ev(protocol.StateRunning, 10, 2, "w9"), fence.Superseded},
		{"a newer submission", ev(protocol.StateQueued, 11, 0, ""), fence.Replaced},
		{"a newer submission running", ev(protocol.StateRunning, 11, 1, "w3"), fence.Replaced},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, fence.Decide(c.last, me))
		})
	}
}

type bundle struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	status  string
	msg     string
	writers func(o fence.Owner) *fence.Writer
}

func setup(t *testing.T, replicas int) *bundle {
	t.Helper()
	_, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, Replicas: replicas})
	require.NoError(t, err)
	b := &bundle{nc: nc, js: js, stream: "Q", status: "q.a.1.status", msg: "q.a.1.msg"}
	b.writers = func(o fence.Owner) *fence.Writer {
		return fence.NewWriter(fence.Config{JS: js, NC: nc, Stream: b.stream, Subject: b.status, Owner: o})
	}
	return b
}

func status(o fence.Owner, state protocol.State) protocol.StatusEvent {
	return protocol.StatusEvent{V: 1, ID: "1", Tenant: "a", State: state, Attempt: o.Attempt, JobSeq: o.JobSeq, Worker: o.Worker, At: time.Now().UTC()}
}

// line publishes one line checked against the writer's token.
func (b *bundle) line(t *testing.T, w *fence.Writer, data string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := nats.NewMsg(b.msg)
	m.Data = []byte(data)
	_, err := b.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequenceForSubject(w.Token(), w.Subject()))
	return err
}

func TestLaterClaimFencesEverythingTheOlderAttemptSends(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	one := fence.Owner{JobSeq: 5, Attempt: 1, Worker: "w1"}
	two := fence.Owner{JobSeq: 5, Attempt: 2, Worker: "w2"}
	w1, w2 := b.writers(one), b.writers(two)

	v, err := w1.Claim(ctx, status(one, protocol.StateRunning))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)
	require.NoError(t, b.line(t, w1, "a1"))
	require.NoError(t, b.line(t, w1, "a2"))

	v, err = w2.Claim(ctx, status(two, protocol.StateRetrying))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)

	// The old attempt has not seen the claim: the server refuses its line
	// and its terminal status anyway.
	err = b.line(t, w1, "a3")
	require.True(t, fence.WrongLastSequence(err), "the zombie's line is rejected: %v", err)
	v, err = w1.Publish(ctx, status(one, protocol.StateSucceeded))
	require.NoError(t, err)
	require.Equal(t, fence.Superseded, v)
	v, err = w1.Recheck(ctx)
	require.NoError(t, err)
	require.Equal(t, fence.Superseded, v)

	// The new attempt writes and ends.
	require.NoError(t, b.line(t, w2, "b3"))
	v, err = w2.Publish(ctx, status(two, protocol.StateSucceeded))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)

	st, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("q.>"))
	require.NoError(t, err)
	require.Equal(t, uint64(3), info.State.Subjects[b.msg], "a1, a2, b3")
	require.Equal(t, uint64(3), info.State.Subjects[b.status], "running@1, retrying@2, succeeded@2")
}

func TestTerminalStatusFirstMeansTheRedeliveryDoesNotRun(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	one := fence.Owner{JobSeq: 5, Attempt: 1, Worker: "w1"}
	two := fence.Owner{JobSeq: 5, Attempt: 2, Worker: "w2"}
	w1, w2 := b.writers(one), b.writers(two)
	_, err := w1.Claim(ctx, status(one, protocol.StateRunning))
	require.NoError(t, err)
	v, err := w1.Publish(ctx, status(one, protocol.StateSucceeded))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)
	v, err = w2.Claim(ctx, status(two, protocol.StateRetrying))
	require.NoError(t, err)
	require.Equal(t, fence.Finished, v, "the redelivery finds the terminal status and does not run")
}

// A status whose PubAck was lost is recognised when read back, and a
// status that does not fence the attempt (a late "queued") is expected
// next instead of failing it.
func TestLostAckAndInterleavedQueuedStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	one := fence.Owner{JobSeq: 5, Attempt: 1, Worker: "w1"}
	w1 := b.writers(one)
	_, err := w1.Claim(ctx, status(one, protocol.StateRunning))
	require.NoError(t, err)

	// The dispatcher's queued status lands after the claim.
	_, err = b.js.Publish(ctx, b.status, []byte(`{"state":"queued","job_seq":5,"attempt":0}`))
	require.NoError(t, err)
	err = b.line(t, w1, "x")
	require.True(t, fence.WrongLastSequence(err))
	v, err := w1.Recheck(ctx)
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v, "a queued status does not fence the running attempt")
	require.NoError(t, b.line(t, w1, "x"))

	// A terminal status stored, its ack lost (published here behind the
	// writer's back): publishing it again reads it back as its own instead
	// of storing it twice.
	done := status(one, protocol.StateSucceeded)
	raw, err := json.Marshal(done)
	require.NoError(t, err)
	_, err = b.js.Publish(ctx, b.status, raw)
	require.NoError(t, err)
	v, err = w1.Publish(ctx, done)
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)
	st, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(b.status))
	require.NoError(t, err)
	require.Equal(t, uint64(3), info.State.Subjects[b.status], "running, queued, succeeded: no second succeeded")
}

// Use hands Claim a last status read elsewhere: a current one is decided
// on without reading again; a stale one (nothing on record, where a later
// attempt's claim now is) costs the claim's compare-and-set, and the read
// back gives the true verdict. Only the next read is replaced.
func TestUseDecidesOnTheStatusReadElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	one := fence.Owner{JobSeq: 5, Attempt: 1, Worker: "w1"}
	two := fence.Owner{JobSeq: 5, Attempt: 2, Worker: "w2"}

	w1 := b.writers(one)
	w1.Use(nil) // read with the ctl subject: nothing on record
	v, err := w1.Claim(ctx, status(one, protocol.StateRunning))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)

	w2 := b.writers(two)
	msgs, err := fence.LastMsgsVia(ctx, b.nc, directget.New(b.nc), b.stream, []string{b.status}, true)
	require.NoError(t, err)
	w2.Use(msgs[0]) // current: w1's running
	v, err = w2.Claim(ctx, status(two, protocol.StateRetrying))
	require.NoError(t, err)
	require.Equal(t, fence.Proceed, v)

	// A stale read: attempt one's zombie sees nothing on record.
	zombie := b.writers(one)
	zombie.Use(nil)
	v, err = zombie.Claim(ctx, status(one, protocol.StateRunning))
	require.NoError(t, err)
	require.Equal(t, fence.Superseded, v, "the compare-and-set failed and the read back found attempt two")
	v, err = zombie.Recheck(ctx)
	require.NoError(t, err)
	require.Equal(t, fence.Superseded, v, "Use replaced one read only")
}

// LastMsgsVia answers as LastMsg does for each subject, through one
// multi-last direct get on a stream that allows them (one replica), or
// leader reads (a stream without direct gets, or oneReplica false).
func TestLastMsgsViaIsTheLeaderRead(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mux := directget.New(nc)
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "D", false: "ND"}[direct]
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct})
		require.NoError(t, err)
		for _, subj := range []string{name + ".q.status", name + ".q.ctl", name + ".q.status"} {
			_, err := js.Publish(ctx, subj, []byte(subj))
			require.NoError(t, err)
		}
		subjects := []string{name + ".q.ctl", name + ".none", name + ".q.status"}
		for _, oneReplica := range []bool{true, false} {
			got, err := fence.LastMsgsVia(ctx, nc, mux, name, subjects, oneReplica)
			require.NoError(t, err, "direct=%v oneReplica=%v", direct, oneReplica)
			require.Len(t, got, 3)
			require.Nil(t, got[1])
			for _, i := range []int{0, 2} {
				want, err := fence.LastMsg(ctx, nc, name, subjects[i])
				require.NoError(t, err)
				require.Equal(t, want.Sequence, got[i].Sequence)
				require.Equal(t, want.Subject, got[i].Subject)
				require.Equal(t, string(want.Data), string(got[i].Data))
				require.True(t, want.Time.Equal(got[i].Time))
			}
			require.Equal(t, uint64(3), got[2].Sequence, "the last of two statuses")
		}
	}
}
