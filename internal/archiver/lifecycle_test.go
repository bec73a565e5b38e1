package archiver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/archiver"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// TestLifecycle: the archiver answers as every service does
// (pkg/startstop): a second Start is refused, Stop closes Stopped, a
// second Stop is fine, and a stopped archiver does not start again.
func TestLifecycle(t *testing.T) {
	_, nc, js := natstest.RunJetStream(t)
	names := protocol.NewNames("")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, provision.Streams(ctx, js, provision.Config{Names: names}))
	store, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	a, err := archiver.New(archiver.Config{NC: nc, Names: names, Store: store})
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	<-a.Started()
	require.ErrorIs(t, a.Start(ctx), startstop.ErrAlreadyStarted)
	require.NoError(t, a.Stop(ctx))
	<-a.Stopped()
	require.NoError(t, a.Stop(ctx), "a second Stop")
	require.ErrorIs(t, a.Start(ctx), startstop.ErrStopped)
}
