package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/natstest"
)

// TestDirectReadOfOneReplicaIsTheLeaderRead checks that LastMsgVia's direct
// get on a one-replica stream returns what the JSON API's leader read does
// (sequence, subject, body, headers, time), says "not found" the same way,
// and falls back to the leader read on a stream without direct gets.
func TestDirectReadOfOneReplicaIsTheLeaderRead(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "D", false: "ND"}[direct]
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct})
		require.NoError(t, err)
		subj := name + ".q.status"
		for i, body := range []string{`{"state":"queued"}`, `{"state":"running"}`} {
			m := nats.NewMsg(subj)
			m.Data = []byte(body)
			m.Header.Set("Fleet-Seq", string(rune('1'+i)))
			_, err := js.PublishMsg(ctx, m)
			require.NoError(t, err)
		}
		_, err = js.Publish(ctx, name+".other", []byte("x"))
		require.NoError(t, err)

		want, err := fence.LastMsg(ctx, nc, name, subj)
		require.NoError(t, err)
		got, err := fence.LastMsgVia(ctx, nc, name, subj, true)
		require.NoError(t, err, "direct=%v", direct)
		require.Equal(t, want.Sequence, got.Sequence)
		require.Equal(t, uint64(2), got.Sequence)
		require.Equal(t, want.Subject, got.Subject)
		require.Equal(t, string(want.Data), string(got.Data))
		require.Equal(t, "2", got.Header.Get("Fleet-Seq"))
		require.True(t, want.Time.Equal(got.Time), "%v != %v", want.Time, got.Time)

		_, err = fence.LastMsgVia(ctx, nc, name, name+".none", true)
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
		_, err = fence.LastMsg(ctx, nc, name, name+".none")
		require.ErrorIs(t, err, jetstream.ErrMsgNotFound)

		seq, ev, err := fence.LastStatusVia(ctx, nc, name, subj, true)
		require.NoError(t, err)
		require.Equal(t, uint64(2), seq)
		require.Equal(t, "running", string(ev.State))
	}
}
