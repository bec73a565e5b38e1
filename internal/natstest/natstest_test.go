package natstest_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunJetStreamServesJetStream(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.RunJetStream(t)
	require.True(t, nc.IsConnected())
	require.True(t, srv.JetStreamEnabled())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "s.1", []byte("hi"))
	require.NoError(t, err)
}

func TestWithMaxPayloadLimitsMessages(t *testing.T) {
	t.Parallel()
	_, nc, _ := natstest.RunJetStream(t, natstest.WithMaxPayload(1024))
	require.EqualValues(t, 1024, nc.MaxPayload())
	require.ErrorIs(t, nc.Publish("x", bytes.Repeat([]byte("a"), 2048)), nats.ErrMaxPayload)
}

func TestRestartKeepsPortAndStore(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.RunJetStream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B", Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "k", []byte("v"))
	require.NoError(t, err)

	url := srv.ClientURL()
	srv.Shutdown()
	require.Eventually(t, func() bool { return !nc.IsConnected() }, 10*time.Second, 10*time.Millisecond)

	srv2 := natstest.Restart(t, srv)
	require.Equal(t, url, srv2.ClientURL())
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond, "the client reconnects")

	kv, err = js.KeyValue(ctx, "B")
	require.NoError(t, err)
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("v"), e.Value())
}
