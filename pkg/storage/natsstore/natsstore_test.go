package natsstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/natsstore"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// TestMain fails the package on leaked goroutines. One nats.go v1.55.0
// goroutine is ignored: ObjectStore.Put makes a throw-away JetStream context
// whose resetPendingAcksOnReconnect goroutine reads publisher.connStatusCh
// under a lock; when Put's deferred cleanupReplySub sets that field to nil
// before the goroutine first runs, the goroutine blocks forever on a nil
// channel. It is an upstream race (jetstream/publish.go newAsyncReply vs
// cleanupReplySub), seen under -race on a busy machine, not a leak of ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

var bucketSeq atomic.Int64

func bucketName() string { return fmt.Sprintf("B%d", bucketSeq.Add(1)) }

func TestKVExercise(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		s, err := natsstore.NewKV(t.Context(), js, bucketName())
		require.NoError(t, err)
		return s
	}, storagetest.Features{TooLargeBytes: 2 << 20})
}

func TestObjectsExercise(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	storagetest.Exercise(t, func(t *testing.T) storage.Store {
		s, err := natsstore.NewObjects(t.Context(), js, bucketName())
		require.NoError(t, err)
		return s
	}, storagetest.Features{})
}

func TestKVMapsKeysToSubjectTokens(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	s, err := natsstore.NewKV(ctx, js, "STATUS")
	require.NoError(t, err)
	require.NoError(t, s.Put(ctx, "status/t1/q.1.json", []byte("v")))

	kv, err := js.KeyValue(ctx, "STATUS")
	require.NoError(t, err)
	e, err := kv.Get(ctx, "status.t1.q/1/json")
	require.NoError(t, err, "the store key is kept with '/' and '.' swapped")
	require.Equal(t, []byte("v"), e.Value())
}

func TestConstructorsAreIdempotentAndKeepExistingBuckets(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	// An operator created the bucket with their own settings.
	_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "OPS", History: 5, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	a, err := natsstore.NewKV(ctx, js, "OPS")
	require.NoError(t, err)
	require.NoError(t, a.Put(ctx, "k", []byte("1")))
	b, err := natsstore.NewKV(ctx, js, "OPS")
	require.NoError(t, err)
	v, err := b.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("1"), v)
	kv, err := js.KeyValue(ctx, "OPS")
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, st.History(), "the operator's settings are kept")

	o1, err := natsstore.NewObjects(ctx, js, "OBJ")
	require.NoError(t, err)
	require.NoError(t, o1.Put(ctx, "a/b", []byte("x")))
	o2, err := natsstore.NewObjects(ctx, js, "OBJ")
	require.NoError(t, err)
	v, err = o2.Get(ctx, "a/b")
	require.NoError(t, err)
	require.Equal(t, []byte("x"), v)
}

func TestConcurrentConstructorsCreateOneBucket(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	errs := make(chan error, 8)
	for range 4 {
		go func() { _, err := natsstore.NewKV(ctx, js, "RACE_KV"); errs <- err }()
		go func() { _, err := natsstore.NewObjects(ctx, js, "RACE_OBJ"); errs <- err }()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

func TestServerDownIsUnavailable(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	kv, err := natsstore.NewKV(ctx, js, "DOWN_KV")
	require.NoError(t, err)
	obs, err := natsstore.NewObjects(ctx, js, "DOWN_OBJ")
	require.NoError(t, err)
	require.NoError(t, kv.Put(ctx, "k", []byte("v")))
	require.NoError(t, obs.Put(ctx, "k", []byte("v")))

	srv.Shutdown()
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, kv.Put(short, "k", []byte("w")), storage.ErrUnavailable)
	short2, cancel2 := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel2()
	_, err = obs.Get(short2, "k")
	require.ErrorIs(t, err, storage.ErrUnavailable)

	natstest.Restart(t, srv)
	var got []byte
	require.Eventually(t, func() bool {
		// Each try is bounded: a request sent as the connection comes
		// back can go unanswered, and a Get without a deadline waits.
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		defer gcancel()
		got, err = kv.Get(gctx, "k")
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "the store works again once NATS is back")
	// The Put that failed as unavailable may still have landed: nats.go
	// resends what it had buffered when it reconnects (package doc).
	require.Contains(t, []string{"v", "w"}, string(got))
	require.NoError(t, kv.Put(ctx, "k", []byte("x")))
	v, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("x"), v)
	v, err = obs.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("v"), v)
}

// TestObjectsListReadsOnlyThePrefix: listing a prefix costs what is under
// it, not what the bucket holds. The archiver lists a query's chunks for
// every query it archives; reading every object's metadata made that cost
// grow with the bucket (every transcript ever stored).
func TestObjectsListReadsOnlyThePrefix(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	s, err := natsstore.NewObjects(ctx, js, bucketName())
	require.NoError(t, err)
	const others = 300
	for i := range others {
		require.NoError(t, s.Put(ctx, fmt.Sprintf("queries/t/q%d/transcript.ndjson", i), []byte("x\n")))
	}
	want := []string{"queries/t/q7/chunks/1.ndjson", "queries/t/q7/chunks/2.ndjson"}
	for _, k := range want {
		require.NoError(t, s.Put(ctx, k, []byte("y\n")))
	}
	before, err := srv.Varz(nil)
	require.NoError(t, err)
	got, err := s.List(ctx, "queries/t/q7/chunks/")
	require.NoError(t, err)
	after, err := srv.Varz(nil)
	require.NoError(t, err)
	require.Equal(t, want, got)
	t.Logf("one List: the server sent %d messages", after.OutMsgs-before.OutMsgs)
	require.Less(t, after.OutMsgs-before.OutMsgs, int64(others/3),
		"messages the server sent for one List, with %d objects elsewhere in the bucket", others)
}

// TestObjectsNameIndex: a bucket written before it had a name index is
// indexed when it is opened, and a name whose object is not stored (a Put
// that died after writing the name) is not listed.
func TestObjectsNameIndex(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	bucket := bucketName()
	raw, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket})
	require.NoError(t, err)
	_, err = raw.PutBytes(ctx, "a/old", []byte("1"))
	require.NoError(t, err)

	s, err := natsstore.NewObjects(ctx, js, bucket)
	require.NoError(t, err)
	got, err := s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/old"}, got, "an object stored before the index is found")

	names, err := js.KeyValue(ctx, natsstore.NamesBucket(bucket))
	require.NoError(t, err)
	_, err = names.Put(ctx, "a.orphan", nil)
	require.NoError(t, err)
	require.NoError(t, s.Put(ctx, "a/new", []byte("2")))
	got, err = s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/new", "a/old"}, got, "a name without its object is not listed")

	require.NoError(t, s.Delete(ctx, "a/old"))
	got, err = s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/new"}, got)
	_, err = names.Get(ctx, "a.old")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a deleted object's name leaves the index")

	// A filled index is not filled again; one whose fill did not finish
	// (no marker) is, by the next NewObjects.
	_, err = raw.PutBytes(ctx, "a/unindexed", []byte("3"))
	require.NoError(t, err)
	s, err = natsstore.NewObjects(ctx, js, bucket)
	require.NoError(t, err)
	got, err = s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/new"}, got)
	require.NoError(t, names.Purge(ctx, "/"))
	s, err = natsstore.NewObjects(ctx, js, bucket)
	require.NoError(t, err)
	got, err = s.List(ctx, "a/")
	require.NoError(t, err)
	require.Equal(t, []string{"a/new", "a/unindexed"}, got)
}

// On a cluster, WithReplicas raises buckets made with fewer replicas (a
// worker started before the dispatcher made them with one) and keeps their
// other settings; it never lowers a bucket's replicas.
func TestWithReplicasRaisesAnExistingBucket(t *testing.T) {
	t.Parallel()
	c := natstest.RunCluster(t, natstest.ClusterOptions(t, 3))
	_, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// Retried as the fleet's processes retry opening storage: a young
	// cluster may not place a bucket yet ("no suitable peers").
	retry := func(open func(ctx context.Context) error) {
		t.Helper()
		require.NoError(t, provision.Retry(ctx, open))
	}
	replicas := func(stream string) int {
		t.Helper()
		s, err := js.Stream(ctx, stream)
		require.NoError(t, err)
		return s.CachedInfo().Config.Replicas
	}

	// Made with one replica, one by an operator with their own history.
	retry(func(ctx context.Context) (err error) { _, err = natsstore.NewKV(ctx, js, "ST"); return err })
	retry(func(ctx context.Context) (err error) { _, err = natsstore.NewObjects(ctx, js, "OB"); return err })
	retry(func(ctx context.Context) (err error) {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "OPS", History: 5, Storage: jetstream.FileStorage})
		return err
	})
	for _, s := range []string{"KV_ST", "OBJ_OB", "KV_OB_NAMES", "KV_OPS"} {
		require.Equal(t, 1, replicas(s), s)
	}

	var ob *natsstore.Objects
	var ops *natsstore.KV
	retry(func(ctx context.Context) (err error) {
		_, err = natsstore.NewKV(ctx, js, "ST", natsstore.WithReplicas(3))
		return err
	})
	retry(func(ctx context.Context) (err error) {
		ob, err = natsstore.NewObjects(ctx, js, "OB", natsstore.WithReplicas(3))
		return err
	})
	retry(func(ctx context.Context) (err error) {
		ops, err = natsstore.NewKV(ctx, js, "OPS", natsstore.WithReplicas(3))
		return err
	})
	for _, s := range []string{"KV_ST", "OBJ_OB", "KV_OB_NAMES", "KV_OPS"} {
		require.Equal(t, 3, replicas(s), "%s is raised to 3 replicas", s)
	}
	kv, err := js.KeyValue(ctx, "OPS")
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, st.History(), "the operator's other settings are kept")

	// The raised buckets work, and a later open asking for fewer keeps 3.
	require.NoError(t, ob.Put(ctx, "a/b", []byte("x")))
	require.NoError(t, ops.Put(ctx, "k", []byte("v")))
	again, err := natsstore.NewObjects(ctx, js, "OB", natsstore.WithReplicas(1))
	require.NoError(t, err)
	v, err := again.Get(ctx, "a/b")
	require.NoError(t, err)
	require.Equal(t, []byte("x"), v)
	require.Equal(t, 3, replicas("OBJ_OB"), "never lowered")

	// A new bucket is made with the replicas asked for.
	retry(func(ctx context.Context) (err error) {
		_, err = natsstore.NewKV(ctx, js, "NEW", natsstore.WithReplicas(3))
		return err
	})
	require.Equal(t, 3, replicas("KV_NEW"))
}
