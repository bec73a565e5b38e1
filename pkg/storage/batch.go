package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Object is one key and value of a batch.
type Object struct {
	Key   string
	Value []byte
}

// Batcher is implemented by stores that write many objects for the price of
// one durable write (FS: one filesystem sync for the whole batch instead of
// an fsync per file and directory).
type Batcher interface {
	// PutBatch writes every object, each atomically (a reader sees the old
	// value or the new one). On error some objects may be written and
	// others not; every one of them may be written again.
	PutBatch(ctx context.Context, objs []Object) error
}

// batchParallel bounds the Puts PutBatch runs at once on a store that is
// not a Batcher (one request each: NATS, S3, Workers KV).
const batchParallel = 8

// PutBatch writes objs to s: with one PutBatch call when s is a Batcher,
// else with Puts, batchParallel at a time. Keys must be distinct. It returns
// every error met (errors.Join); objects whose Put failed may be retried.
func PutBatch(ctx context.Context, s Store, objs []Object) error {
	if len(objs) == 0 {
		return nil
	}
	if b, ok := s.(Batcher); ok {
		return b.PutBatch(ctx, objs)
	}
	if len(objs) == 1 {
		return s.Put(ctx, objs[0].Key, objs[0].Value)
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, batchParallel)
	)
	for _, o := range objs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.Put(ctx, o.Key, o.Value); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("put %s: %w", o.Key, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
