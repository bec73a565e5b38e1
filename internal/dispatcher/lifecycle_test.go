package dispatcher

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait for an event (generous: `make test` runs all
// packages at once on 2 cores).
const wait = time.Minute

func newService(t *testing.T, status storage.Store) (*Service, *natsConn) {
	t.Helper()
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	objects, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	if status == nil {
		status = objects
	}
	svc, err := New(Config{
		NC: nc, Status: status, Objects: objects,
		Provision: provision.Config{Names: protocol.NewNames(""), Storage: jetstream.MemoryStorage},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop(context.Background()) })
	return svc, &natsConn{js: js, subs: func() int { return nc.NumSubscriptions() }}
}

type natsConn struct {
	js   jetstream.JetStream
	subs func() int
}

// waitSubs waits until the connection has n subscriptions (draining
// subscriptions go away asynchronously).
func (c *natsConn) waitSubs(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for c.subs() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d subscriptions, want %d", what, c.subs(), n)
		}
		<-tick.C
	}
}

// TestStartTwice: a second Start (cmd/dispatcher/serve.go retries Start)
// must not subscribe the API handlers and consumers a second time; it is
// refused as startstop says.
func TestStartTwice(t *testing.T) {
	svc, c := newService(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, svc.Start(ctx))
	// The admitter subscribes once it leads, after Start returned.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !svc.Admitting() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the dispatcher never took the admitter lease")
		}
	}
	subs := c.subs()
	require.ErrorIs(t, svc.Start(ctx), startstop.ErrAlreadyStarted, "a second Start must be refused")
	require.Equal(t, subs, c.subs(), "a refused Start subscribes nothing")
}

// TestStartRetryAfterPartialFailure: a Start that fails half-way undoes
// what it began, so the retry serve.go makes leaves one set of handlers.
func TestStartRetryAfterPartialFailure(t *testing.T) {
	svc, c := newService(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// A dead-letter consumer whose deliver policy cannot be updated makes
	// Start fail after it started the status index (its consumer and
	// writer): the failed Start must stop it.
	require.NoError(t, provision.Streams(ctx, c.js, svc.cfg.Provision))
	before := c.subs() // the connection's request inbox, now made
	_, err := c.js.CreateConsumer(ctx, svc.names.AdvisoryStream(), jetstream.ConsumerConfig{
		Durable: DLQConsumer, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	require.NoError(t, err)
	require.Error(t, svc.Start(ctx))
	c.waitSubs(t, before, "a failed Start leaves no subscription behind")
	require.False(t, svc.Ready())

	require.NoError(t, c.js.DeleteConsumer(ctx, svc.names.AdvisoryStream(), DLQConsumer))
	require.NoError(t, svc.Start(ctx))
	require.True(t, svc.Ready())
	require.NoError(t, svc.Stop(ctx))
	c.waitSubs(t, before, "Stop leaves no subscription behind")
	require.ErrorIs(t, svc.Start(ctx), startstop.ErrStopped, "Start after Stop is refused")
}

// blockingStore holds the first status write until released.
type blockingStore struct {
	storage.Store
	entered  chan struct{}
	release  chan struct{}
	finished atomic.Bool
	first    atomic.Bool
}

func (b *blockingStore) Put(ctx context.Context, key string, value []byte) error {
	if b.first.CompareAndSwap(false, true) {
		close(b.entered)
		<-b.release
		err := b.Store.Put(ctx, key, value)
		b.finished.Store(true)
		return err
	}
	return b.Store.Put(ctx, key, value)
}

// TestStopWaitsForIndexBatch: Stop returns only once the status index batch
// being written is done, so nothing writes to storage after Stop (make
// bench removed the storage dir under a late batch).
func TestStopWaitsForIndexBatch(t *testing.T) {
	fs, err := storage.NewFS(t.TempDir())
	require.NoError(t, err)
	bs := &blockingStore{Store: fs, entered: make(chan struct{}), release: make(chan struct{})}
	svc, c := newService(t, bs)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, provision.Streams(ctx, c.js, svc.cfg.Provision))
	idle := c.subs() // the connection's request inbox, now made
	require.NoError(t, svc.Start(ctx))
	ev, err := json.Marshal(protocol.StatusEvent{V: protocol.SchemaVersion, ID: "q1", Tenant: "default", State: protocol.StateRunning, Attempt: 1})
	require.NoError(t, err)
	_, err = c.js.Publish(ctx, svc.names.QueryStatus("default", "q1"), ev)
	require.NoError(t, err)
	select {
	case <-bs.entered:
	case <-ctx.Done():
		t.Fatal("the index never wrote the status")
	}
	stopped := make(chan bool, 1)
	go func() {
		_ = svc.Stop(ctx)
		stopped <- bs.finished.Load()
	}()
	// Release the write only once Stop has drained the subscriptions, so
	// a Stop that does not wait for the index loop returns before it.
	c.waitSubs(t, idle, "Stop drains the subscriptions")
	close(bs.release)
	require.True(t, <-stopped, "Stop returned while the index batch was still writing")
}
