package backends_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
)

// TestNATSStorageSurvivesANodeLoss: on a 3-node cluster a worker opens
// nats:// storage first (one replica: it has no --replicas) and writes a
// status record and a transcript. The dispatcher then opens it with
// --replicas 3 (Deps.Replicas) for status and nats://?replicas=3 for
// objects: the existing buckets, the name index included, are scaled up
// to three replicas. Then the node that held each one-replica bucket is
// killed in turn, and what was written is still read. Without the scale-up
// the buckets stay on that one node and the reads never succeed.
func TestNATSStorageSurvivesANodeLoss(t *testing.T) {
	c := natstest.RunCluster(t, natstest.ClusterOptions(t, 3))
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const statusKey, objectKey = "status/t/q1.json", "transcripts/t/q1.jsonl"
	worker := backends.Deps{JS: js}
	ws, err := backends.Open(ctx, "nats://", backends.Status, worker)
	require.NoError(t, err)
	require.NoError(t, ws.Put(ctx, statusKey, []byte(`{"state":"succeeded"}`)))
	wo, err := backends.Open(ctx, "nats://", backends.Objects, worker)
	require.NoError(t, err)
	require.NoError(t, wo.Put(ctx, objectKey, []byte("line 1\n")))
	holders := map[string]string{}
	for _, stream := range []string{"KV_FLEET_STATUS", "OBJ_FLEET_TRANSCRIPTS"} {
		info := streamInfo(ctx, t, js, stream)
		require.Equal(t, 1, info.Config.Replicas, stream)
		holders[stream] = info.Cluster.Leader
	}

	status, err := backends.Open(ctx, "nats://", backends.Status, backends.Deps{JS: js, Replicas: 3})
	require.NoError(t, err)
	objects, err := backends.Open(ctx, "nats://?replicas=3", backends.Objects, backends.Deps{JS: js})
	require.NoError(t, err)
	for _, stream := range []string{"KV_FLEET_STATUS", "OBJ_FLEET_TRANSCRIPTS", "KV_FLEET_TRANSCRIPTS_NAMES"} {
		require.Equal(t, 3, streamInfo(ctx, t, js, stream).Config.Replicas, stream)
		waitReplicated(ctx, t, js, stream)
	}

	for stream, get := range map[string]func() ([]byte, error){
		"KV_FLEET_STATUS":       func() ([]byte, error) { return status.Get(ctx, statusKey) },
		"OBJ_FLEET_TRANSCRIPTS": func() ([]byte, error) { return objects.Get(ctx, objectKey) },
	} {
		node := c.Node(holders[stream])
		require.NotEqual(t, -1, node, holders[stream])
		c.Kill(node)
		tick := time.NewTicker(50 * time.Millisecond)
		for {
			b, err := get()
			if err == nil {
				require.NotEmpty(t, b)
				break
			}
			select { // until a new leader answers
			case <-ctx.Done():
				t.Fatalf("%s unreadable with %s down: %v", stream, holders[stream], err)
			case <-tick.C:
			}
		}
		tick.Stop()
		c.Restart(node)
		waitReplicated(ctx, t, js, stream)
	}
	keys, err := objects.List(ctx, "transcripts/")
	require.NoError(t, err)
	require.Equal(t, []string{objectKey}, keys)
	_, err = status.Get(ctx, "status/t/none.json")
	require.ErrorIs(t, err, storage.ErrNotFound)
}

func streamInfo(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err, stream)
	info := s.CachedInfo()
	require.NotNil(t, info.Cluster, stream)
	return info
}

// waitReplicated waits until stream has a leader and two current followers.
func waitReplicated(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s, err := js.Stream(ctx, stream)
		if err == nil {
			cl := s.CachedInfo().Cluster
			current := 0
			for _, p := range cl.Replicas {
				if p.Current && !p.Offline {
					current++
				}
			}
			if cl.Leader != "" && current == 2 {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not replicated: %v", stream, err)
		case <-tick.C:
		}
	}
}
