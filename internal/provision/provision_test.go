package provision

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStreamsSurviveALostReply: the JetStream API's reply to one
// provisioning request never comes (on a cluster, a meta leader change
// while it was in flight). Provisioning tries it again and makes every
// stream and the work consumer, instead of waiting out its whole context
// on the lost reply. The requests go through a relay on core NATS that
// drops the first one and passes the others to the real server.
func TestStreamsSurviveALostReply(t *testing.T) {
	old := attemptTimeout
	attemptTimeout = 300 * time.Millisecond
	t.Cleanup(func() { attemptTimeout = old })

	_, nc, js := natstest.RunJetStream(t)
	var seen atomic.Int64
	viaRelay := natstest.APIRelay(t, nc, func(string, *nats.Msg) bool {
		return seen.Add(1) == 1 // lost
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := protocol.NewNames("")
	require.NoError(t, Streams(ctx, viaRelay, Config{Names: names}))
	require.Greater(t, seen.Load(), int64(1))
	for _, name := range []string{names.JobsStream(), names.QueriesStream(), names.DLQStream(), names.AdvisoryStream()} {
		_, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
	}
	_, err := js.Consumer(ctx, names.JobsStream(), names.Consumer())
	require.NoError(t, err)
}

// TestRetryStopsAtAPermanentError: an error that another try cannot fix
// (here: a stream name in use with another configuration) is returned at
// once; a transient one is tried again until the context ends, and the
// error says both.
func TestRetryStopsAtAPermanentError(t *testing.T) {
	var tries int
	inUse := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}
	err := Retry(context.Background(), func(context.Context) error { tries++; return inUse })
	require.ErrorIs(t, err, inUse)
	require.Equal(t, 1, tries)

	tries = 0
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	notAvail := &jetstream.APIError{Code: 503, ErrorCode: errCodeClusterNotAvail, Description: "JetStream system temporarily unavailable"}
	err = Retry(ctx, func(context.Context) error { tries++; return notAvail })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, notAvail)
	require.Greater(t, tries, 1)
	require.True(t, errors.Is(err, notAvail))
}
