package directget_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/natstest"
)

// streamQ starts a server with stream Q (subjects q.>, direct gets) and
// returns a connection, its JetStream context and a 30 s context.
func streamQ(t *testing.T) (*server.Server, *nats.Conn, jetstream.JetStream, jetstream.Stream, context.Context) {
	t.Helper()
	srv, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, AllowDirect: true})
	require.NoError(t, err)
	return srv, nc, js, st, ctx
}

// LastMsgs answers for each subject what a last-by-subject get answers
// (sequence, subject, body, headers, time), nil where a subject has
// nothing, in the order asked, with one subscription for all its gets;
// a stream that answers no direct gets, or none at all, says so.
func TestLastMsgs(t *testing.T) {
	t.Parallel()
	srv, nc, js, st, ctx := streamQ(t)
	for i, body := range []string{"s1", "c1", "s2", "m1"} {
		m := nats.NewMsg(map[int]string{0: "q.a.status", 1: "q.a.ctl", 2: "q.a.status", 3: "q.b.msg"}[i])
		m.Data = []byte(body)
		m.Header.Set("Fleet-Seq", body)
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	mux := directget.New(nc)
	subs0 := srv.NumSubscriptions()
	for range 3 {
		got, err := mux.LastMsgs(ctx, "Q", []string{"q.b.status", "q.a.ctl", "q.a.status", "q.b.msg"})
		require.NoError(t, err)
		require.Len(t, got, 4)
		require.Nil(t, got[0], "nothing on q.b.status")
		for i, subj := range []string{"q.a.ctl", "q.a.status", "q.b.msg"} {
			want, err := st.GetLastMsgForSubject(ctx, subj)
			require.NoError(t, err)
			m := got[i+1]
			require.NotNil(t, m, subj)
			require.Equal(t, want.Subject, m.Subject)
			require.Equal(t, want.Sequence, m.Sequence)
			require.Equal(t, string(want.Data), string(m.Data))
			require.Equal(t, string(want.Data), m.Header.Get("Fleet-Seq"))
			require.True(t, want.Time.Equal(m.Time), "%v != %v", want.Time, m.Time)
		}
		none, err := mux.LastMsgs(ctx, "Q", []string{"q.c.status", "q.c.ctl"})
		require.NoError(t, err)
		require.Equal(t, []*jetstream.RawStreamMsg{nil, nil}, none)
	}
	require.LessOrEqual(t, srv.NumSubscriptions(), subs0+1, "one subscription for every get")

	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ND", Subjects: []string{"nd.>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "nd.x", []byte("x"))
	require.NoError(t, err)
	_, err = mux.LastMsgs(ctx, "ND", []string{"nd.x"})
	require.ErrorIs(t, err, directget.ErrNoDirect)
	_, err = mux.LastMsgs(ctx, "MISSING", []string{"m.x"})
	require.ErrorIs(t, err, directget.ErrNoDirect)

	gone, cancelGone := context.WithCancel(ctx)
	cancelGone()
	_, err = mux.LastMsgs(gone, "Q", []string{"q.a.ctl"})
	require.ErrorIs(t, err, context.Canceled)
}

// Count counts the messages on a subject at or after a sequence, others
// interleaved, including a large one (the get answers with one message
// whatever its size); none is 0; a stream without direct gets says so.
func TestCount(t *testing.T) {
	t.Parallel()
	_, nc, js, _, ctx := streamQ(t)
	var seqs []uint64 // of q.a.msg
	for i := range 40 {
		subj := "q.a.msg"
		if i%3 == 0 {
			subj = "q.b.msg"
		}
		body := []byte(strconv.Itoa(i))
		if i == 10 {
			body = make([]byte, 200<<10)
		}
		ack, err := js.Publish(ctx, subj, body)
		require.NoError(t, err)
		if subj == "q.a.msg" {
			seqs = append(seqs, ack.Sequence)
		}
	}
	mux := directget.New(nc)
	for i, from := range seqs {
		n, err := mux.Count(ctx, "Q", "q.a.msg", from)
		require.NoError(t, err)
		require.Equal(t, uint64(len(seqs)-i), n, "from %d", from)
		n, err = mux.Count(ctx, "Q", "q.a.msg", from+1)
		require.NoError(t, err)
		require.Equal(t, uint64(len(seqs)-i-1), n, "from %d", from+1)
	}
	n, err := mux.Count(ctx, "Q", "q.c.msg", 0)
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ND", Subjects: []string{"nd.>"}})
	require.NoError(t, err)
	_, err = mux.Count(ctx, "ND", "nd.x", 1)
	require.ErrorIs(t, err, directget.ErrNoDirect)
}

// RawMsg reads any reply's headers without panicking: a sequence it
// returns is the header's number, a time the header's RFC 3339 time.
func FuzzRawMsg(f *testing.F) {
	f.Add("12", "q.a.status", "2026-11-26T04:00:00.123456789Z", []byte(`{"state":"running"}`))
	f.Add("", "", "", []byte(nil))
	f.Add("18446744073709551616", "x", "yesterday", []byte("x"))
	f.Fuzz(func(t *testing.T, seq, subject, ts string, data []byte) {
		m := nats.NewMsg("_INBOX.x")
		m.Header.Set(jetstream.SequenceHeader, seq)
		m.Header.Set(jetstream.SubjectHeader, subject)
		m.Header.Set(jetstream.TimeStampHeaer, ts)
		m.Data = data
		rm, err := directget.RawMsg(m)
		if err != nil {
			return
		}
		want, err := strconv.ParseUint(seq, 10, 64)
		require.NoError(t, err)
		require.Equal(t, want, rm.Sequence)
		require.Equal(t, m.Header.Get(jetstream.SubjectHeader), rm.Subject)
		require.Equal(t, data, rm.Data)
		if m.Header.Get(jetstream.TimeStampHeaer) != "" {
			want, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
			require.NoError(t, err)
			require.True(t, want.Equal(rm.Time))
		}
	})
}

func TestEach(t *testing.T) {
	t.Parallel()
	_, nc, js, _, ctx := streamQ(t)
	// More than one batch, interleaved with another subject, with large
	// messages that a batch's byte bound splits.
	var want []string
	var seqs []uint64
	for i := range 700 {
		subj := "q.a.msg"
		if i%3 == 0 {
			subj = "q.b.msg"
		}
		body := []byte(strconv.Itoa(i))
		if i%100 == 1 {
			body = append(make([]byte, 900<<10), body...)
		}
		ack, err := js.Publish(ctx, subj, body)
		require.NoError(t, err)
		if subj == "q.a.msg" {
			want = append(want, string(body))
			seqs = append(seqs, ack.Sequence)
		}
	}
	mux := directget.New(nc)
	read := func(from uint64) (got []string) {
		t.Helper()
		require.NoError(t, mux.Each(ctx, "Q", "q.a.msg", from, func(m *jetstream.RawStreamMsg) error {
			got = append(got, string(m.Data))
			return nil
		}))
		return got
	}
	require.Equal(t, want, read(0), "every message, in order")
	require.Equal(t, want[100:], read(seqs[100]), "from a sequence on")
	require.Empty(t, read(seqs[len(seqs)-1]+1))
	none := 0
	require.NoError(t, mux.Each(ctx, "Q", "q.c.msg", 0, func(*jetstream.RawStreamMsg) error { none++; return nil }))
	require.Zero(t, none)

	stop := errors.New("stop")
	n := 0
	err := mux.Each(ctx, "Q", "q.a.msg", 0, func(*jetstream.RawStreamMsg) error {
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 3, n)
}

// A stored message that carries headers named as the server's (a copy of
// a message read back, published again) is read with the server's values.
func TestRawMsgTakesTheServersHeaders(t *testing.T) {
	t.Parallel()
	_, nc, js, _, ctx := streamQ(t)
	_, err := js.Publish(ctx, "q.first", []byte("1"))
	require.NoError(t, err)
	m := nats.NewMsg("q.a.msg")
	m.Header.Set(jetstream.SequenceHeader, "999")
	m.Header.Set(jetstream.SubjectHeader, "q.other")
	m.Header.Set(jetstream.TimeStampHeaer, "not a time")
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	var got []*jetstream.RawStreamMsg
	require.NoError(t, directget.New(nc).Each(ctx, "Q", "q.a.msg", 1, func(m *jetstream.RawStreamMsg) error {
		got = append(got, m)
		return nil
	}))
	require.Len(t, got, 1)
	require.Equal(t, uint64(2), got[0].Sequence)
	require.Equal(t, "q.a.msg", got[0].Subject)
	require.WithinDuration(t, time.Now(), got[0].Time, time.Minute)
}
