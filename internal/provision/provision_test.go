package provision

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/jsretry"
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
	t.Cleanup(jsretry.SetAttemptTimeout(300 * time.Millisecond))

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
