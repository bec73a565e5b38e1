package admission

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestStartRidesOutNoSuitablePeers: the meta leader of a cluster cannot
// place a replicated bucket yet. Until it has a peer's first statistics
// it counts that peer as offline, and answers "no suitable peers for
// placement, peer offline"; a CI run's dispatcher failed to start on that
// answer for FLEET_ADMITTER, the buckets before it made. Start tries each
// bucket again and succeeds. The JetStream API goes through a relay that
// answers the first create of every bucket with that error (as the
// server words it) and passes everything else to a real server.
func TestStartRidesOutNoSuitablePeers(t *testing.T) {
	_, nc, js := natstest.RunJetStream(t)
	names := protocol.NewNames("")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, provision.Streams(ctx, js, provision.Config{Names: names}))

	var refuse natstest.NoPeersOnce
	viaRelay := natstest.APIRelay(t, nc, refuse.Intercept)

	a, err := New(Config{JS: viaRelay, NC: nc, Names: names, Policy: Policy{FleetCap: 4}})
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	for _, bucket := range []string{names.TenantsBucket(), names.AdmissionBucket(), names.AdmitterBucket()} {
		require.True(t, refuse.Refused("KV_"+bucket), "no create of %s was refused", bucket)
		_, err := js.KeyValue(ctx, bucket)
		require.NoError(t, err, bucket)
	}
}
