package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// replicasMaxAge is how long the worker trusts the replica count it read
// of FLEET_QUERIES: a dispatcher started with another --replicas updates
// the stream while workers run.
const replicasMaxAge = 30 * time.Second

// queries is what the worker knows of FLEET_QUERIES: its handle, looked
// up once, and its replica count, read again at most every replicasMaxAge.
type queries struct {
	js      jetstream.JetStream
	name    string
	timeout time.Duration // each lookup
	// cleanup tracks the background reads (Stop waits for them);
	// stopping reports the worker stopping (no read starts then).
	cleanup  *sync.WaitGroup
	stopping func() bool

	mu sync.Mutex
	st jetstream.Stream
	// replicas is the replica count (0 until read), read at replicasAt.
	replicas   atomic.Int32
	replicasAt atomic.Int64
	replicasIn atomic.Bool
}

// stream is the FLEET_QUERIES handle, looked up once (a handle is only
// the stream's name and cached info; message gets go to the server).
func (q *queries) stream(ctx context.Context) (jetstream.Stream, error) {
	q.mu.Lock()
	st := q.st
	q.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := q.js.Stream(ctx, q.name)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	q.st = st
	q.mu.Unlock()
	return st, nil
}

// replicated reports whether FLEET_QUERIES has more than one replica, as
// its handle's cached info says (when it cannot be looked up: true, the
// safe choice of one line in flight).
func (q *queries) replicated(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, q.timeout)
	defer cancel()
	st, err := q.stream(cctx)
	if err != nil {
		return true
	}
	info := st.CachedInfo()
	return info == nil || info.Config.Replicas > 1
}

// oneReplica reports whether FLEET_QUERIES is known to have a single
// replica, whose server is then its leader: the claim's reads of the last
// status and last line go to it as direct gets (fence.LastMsgVia). Until
// the count is known, and for replicas that may lag, the reads use the
// JSON API, which the leader answers. The count is read in the
// background, never on a run's path.
func (q *queries) oneReplica() bool {
	if time.Since(time.Unix(0, q.replicasAt.Load())) > replicasMaxAge && !q.stopping() && q.replicasIn.CompareAndSwap(false, true) {
		q.cleanup.Go(func() {
			defer q.replicasIn.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
			defer cancel()
			st, err := q.js.Stream(ctx, q.name)
			if err != nil {
				return
			}
			q.replicas.Store(int32(max(st.CachedInfo().Config.Replicas, 1)))
			q.replicasAt.Store(time.Now().UnixNano())
		})
	}
	return q.replicas.Load() == 1
}
