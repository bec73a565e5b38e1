package keyqueue

import (
	"context"
	"sync"

	"github.com/agentfleet/agentfleet/pkg/startstop"
)

// Queue holds the newest request of each key until its worker takes it.
// The zero value is ready to use; set Name before Start to name its errors.
type Queue[V any] struct {
	startstop.Base

	mu      sync.Mutex
	pending map[string]V // nil while not running
	order   []string     // keys, oldest request first
	wake    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start starts the worker: run is called for each request taken, one at
// a time, with a context that Stop cancels (not ctx, which bounds Start
// alone).
func (q *Queue[V]) Start(ctx context.Context, run func(ctx context.Context, key string, v V)) error {
	return q.Base.Start(ctx, func(context.Context) error {
		rctx, cancel := context.WithCancel(context.Background())
		q.mu.Lock()
		q.pending, q.order = map[string]V{}, nil
		q.wake, q.cancel, q.done = make(chan struct{}, 1), cancel, make(chan struct{})
		q.mu.Unlock()
		go q.loop(rctx, run)
		return nil
	})
}

// Stop drops the waiting requests, cancels the one under way and waits
// for it to return, bounded by ctx.
func (q *Queue[V]) Stop(ctx context.Context) error {
	return q.Base.Stop(ctx, func(ctx context.Context) error {
		q.mu.Lock()
		q.cancel()
		q.pending, q.order = nil, nil
		q.mu.Unlock()
		select {
		case <-q.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// Put asks for key with v; a request of key still waiting is replaced by
// this one and keeps its place. It returns at once, and false (nothing
// queued) while the queue is not running.
func (q *Queue[V]) Put(key string, v V) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending == nil {
		return false
	}
	if _, waiting := q.pending[key]; !waiting {
		q.order = append(q.order, key)
	}
	q.pending[key] = v
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// next takes the oldest request.
func (q *Queue[V]) next() (key string, v V, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return "", v, false
	}
	key, q.order = q.order[0], q.order[1:]
	v = q.pending[key]
	delete(q.pending, key)
	return key, v, true
}

func (q *Queue[V]) loop(ctx context.Context, run func(ctx context.Context, key string, v V)) {
	defer close(q.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		}
		for ctx.Err() == nil {
			key, v, ok := q.next()
			if !ok {
				break
			}
			run(ctx, key, v)
		}
	}
}
