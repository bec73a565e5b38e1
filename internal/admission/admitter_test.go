package admission

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
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

	var mu sync.Mutex
	refused := map[string]bool{}
	viaRelay := natstest.APIRelay(t, nc, func(api string, m *nats.Msg) bool {
		if !strings.HasPrefix(api, "STREAM.CREATE.KV_") {
			return false
		}
		mu.Lock()
		first := !refused[api]
		refused[api] = true
		mu.Unlock()
		if first {
			_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.stream_create_response",` +
				`"error":{"code":400,"err_code":10005,"description":"no suitable peers for placement, peer offline"}}`))
		}
		return first
	})

	a, err := New(Config{JS: viaRelay, NC: nc, Names: names, Policy: Policy{FleetCap: 4}})
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	for _, bucket := range []string{names.TenantsBucket(), names.AdmissionBucket(), names.AdmitterBucket()} {
		mu.Lock()
		require.True(t, refused["STREAM.CREATE.KV_"+bucket], "no create of %s was refused", bucket)
		mu.Unlock()
		_, err := js.KeyValue(ctx, bucket)
		require.NoError(t, err, bucket)
	}
}

// TestLifecycle: the admitter answers as every service does
// (pkg/startstop): a second Start is refused, Stop hands the lease
// back (another admitter need not wait for it to expire), a second Stop returns the
// first's result, and a stopped admitter does not start again.
func TestLifecycle(t *testing.T) {
	_, nc, js := natstest.RunJetStream(t)
	names := protocol.NewNames("")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, provision.Streams(ctx, js, provision.Config{Names: names}))
	a, err := New(Config{JS: js, NC: nc, Names: names, Policy: Policy{FleetCap: 4}, LeaseTTL: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	require.NoError(t, a.Start(ctx))
	<-a.Started()
	require.ErrorIs(t, a.Start(ctx), startstop.ErrAlreadyStarted)
	require.Eventually(t, a.Leading, time.Minute, 5*time.Millisecond, "the only admitter leads")

	require.NoError(t, a.Stop(ctx))
	<-a.Stopped()
	require.False(t, a.Leading())
	lease, err := js.KeyValue(ctx, names.AdmitterBucket())
	require.NoError(t, err)
	_, err = lease.Get(ctx, leaderKey)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "Stop hands the lease back")
	require.NoError(t, a.Stop(ctx), "a second Stop")
	require.ErrorIs(t, a.Start(ctx), startstop.ErrStopped)
}
