package jspub

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
)

func wait(t *testing.T, notify <-chan struct{}, a *Ack) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !a.Done() {
		select {
		case <-notify:
		case <-deadline:
			t.Fatal("no acknowledgement in a minute")
		}
	}
}

// Acks carry the stored sequence, the stream's refusal as the API error
// nats.go would give, and no-responders when no stream takes the subject.
func TestPublisherAgainstAServer(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	require.NoError(t, err)
	p := New(nc)
	t.Cleanup(func() { _ = p.Close() })
	notify := make(chan struct{}, 1)

	var acks []*Ack
	for i := range 300 {
		m := nats.NewMsg("s.a")
		m.Data = []byte(strconv.Itoa(i))
		a, err := p.Publish(m, notify)
		require.NoError(t, err)
		acks = append(acks, a)
	}
	for i, a := range acks {
		wait(t, notify, a)
		require.NoError(t, a.Err)
		require.Equal(t, uint64(i+1), a.Seq)
	}

	// A compare-and-set the stream refuses.
	m := nats.NewMsg("s.b")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "7")
	a, err := p.Publish(m, notify)
	require.NoError(t, err)
	wait(t, notify, a)
	var apiErr *jetstream.APIError
	require.True(t, errors.As(a.Err, &apiErr), "%v", a.Err)
	require.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)

	// A duplicate is acknowledged with the first copy's sequence.
	for range 2 {
		m = nats.NewMsg("s.c")
		m.Header.Set(jetstream.MsgIDHeader, "once")
		a, err = p.Publish(m, notify)
		require.NoError(t, err)
		wait(t, notify, a)
		require.NoError(t, a.Err)
		require.Equal(t, uint64(301), a.Seq)
	}

	// No stream on the subject.
	a, err = p.Publish(nats.NewMsg("nowhere"), notify)
	require.NoError(t, err)
	wait(t, notify, a)
	require.ErrorIs(t, a.Err, jetstream.ErrNoStreamResponse)

	// A forgotten Ack is never resolved and holds no entry.
	a, err = p.Publish(nats.NewMsg("s.d"), nil)
	require.NoError(t, err)
	p.Forget(a)
	require.NoError(t, nc.Flush())
	require.Equal(t, 0, p.InFlight())

	require.NoError(t, p.Close())
	_, err = p.Publish(nats.NewMsg("s.e"), nil)
	require.ErrorIs(t, err, ErrClosed)
}

func TestParseAck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		seq  uint64
		code jetstream.ErrorCode // 0: no API error
		bad  bool
	}{
		{in: `{"stream":"FLEET_QUERIES","seq":42}`, seq: 42},
		{in: `{"stream":"S","domain":"hub","seq":7}`, seq: 7},
		{in: `{"stream":"S","seq":9,"duplicate": true}`, seq: 9},
		{in: `{"stream":"S","seq":0,"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`, code: jetstream.JSErrCodeStreamWrongLastSequence},
		{in: `{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled"}}`, code: 10039},
		{in: `{"stream":"a\",\"seq\":1,\"x","seq":5}`, seq: 5},
		{in: `{"seq":5}`, bad: true},
		{in: `{"stream":"S","seq":`, bad: true},
		{in: ``, bad: true},
	} {
		seq, err := ParseAck([]byte(c.in))
		switch {
		case c.bad:
			require.ErrorIs(t, err, ErrInvalidAck, c.in)
		case c.code != 0:
			var apiErr *jetstream.APIError
			require.True(t, errors.As(err, &apiErr), c.in)
			require.Equal(t, c.code, apiErr.ErrorCode, c.in)
		default:
			require.NoError(t, err, c.in)
			require.Equal(t, c.seq, seq, c.in)
		}
	}
}

// The hand-read path agrees with encoding/json on every input it takes.
func FuzzParseAck(f *testing.F) {
	f.Add([]byte(`{"stream":"FLEET_QUERIES","seq":42}`))
	f.Add([]byte(`{"stream":"S","seq":9,"duplicate": true}`))
	f.Add([]byte(`{"stream":"S","seq":18446744073709551615}`))
	f.Add([]byte(`{"stream":"S","seq":0,"error":{"code":400,"err_code":10071,"description":"x"}}`))
	f.Add([]byte(`{"stream":"S","seq":1,"seq":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, err := ParseAck(b)
		want, werr := decodeAck(b)
		if !json.Valid(b) {
			return // the server writes JSON; only agreement on it matters
		}
		if werr != nil {
			require.Error(t, err, "%q", b)
			return
		}
		require.NoError(t, err, "%q", b)
		require.Equal(t, want, seq, "%q", b)
	})
}
