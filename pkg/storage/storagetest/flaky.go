package storagetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Flaky wraps a Store and fails calls on demand, to test outage handling.
// While down (SetDown(true)), or for the next N calls (FailNext(n)), every
// call returns an error wrapping storage.ErrUnavailable without reaching the
// inner store. Each failed call signals on Failed(), so a test can wait for
// "the code under test tried and failed" instead of sleeping.
//
// Flaky always implements Creator and StreamPutter. When the inner store
// lacks them, Create is emulated as Get-then-Put (not atomic) and PutStream
// reads the whole stream and calls Put.
type Flaky struct {
	inner storage.Store

	mu       sync.Mutex
	down     bool
	failNext int
	failures int
	calls    int

	failed chan struct{} // capacity 1: coalesced "a call failed" signal
}

var (
	_ storage.Store        = (*Flaky)(nil)
	_ storage.Creator      = (*Flaky)(nil)
	_ storage.StreamPutter = (*Flaky)(nil)
)

// NewFlaky wraps inner; it starts up (passing every call through).
func NewFlaky(inner storage.Store) *Flaky {
	return &Flaky{inner: inner, failed: make(chan struct{}, 1)}
}

// Inner returns the wrapped store, for assertions that must bypass outages.
func (f *Flaky) Inner() storage.Store { return f.inner }

// SetDown switches the store down (every call fails) or back up.
func (f *Flaky) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// FailNext makes the next n calls fail, whether or not the store is down.
func (f *Flaky) FailNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = n
}

// Failed returns a channel that receives after a call failed because of
// SetDown or FailNext. Signals are coalesced: one receive means "at least one
// call failed since the previous receive". Drain it before switching the store
// down if an earlier outage may have left a signal.
func (f *Flaky) Failed() <-chan struct{} { return f.failed }

// Failures returns how many calls failed because of SetDown or FailNext.
func (f *Flaky) Failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures
}

// Calls returns how many calls were made, failed ones included.
func (f *Flaky) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// check counts the call and decides whether it fails.
func (f *Flaky) check(op, key string) error {
	f.mu.Lock()
	f.calls++
	fail := f.down || f.failNext > 0
	if fail {
		if f.failNext > 0 {
			f.failNext--
		}
		f.failures++
	}
	f.mu.Unlock()
	if !fail {
		return nil
	}
	select {
	case f.failed <- struct{}{}:
	default:
	}
	return fmt.Errorf("storagetest: flaky %s %q: %w", op, key, storage.ErrUnavailable)
}

// Put implements storage.Store.
func (f *Flaky) Put(ctx context.Context, key string, value []byte) error {
	if err := f.check("put", key); err != nil {
		return err
	}
	return f.inner.Put(ctx, key, value)
}

// Get implements storage.Store.
func (f *Flaky) Get(ctx context.Context, key string) ([]byte, error) {
	if err := f.check("get", key); err != nil {
		return nil, err
	}
	return f.inner.Get(ctx, key)
}

// List implements storage.Store.
func (f *Flaky) List(ctx context.Context, prefix string) ([]string, error) {
	if err := f.check("list", prefix); err != nil {
		return nil, err
	}
	return f.inner.List(ctx, prefix)
}

// Delete implements storage.Store.
func (f *Flaky) Delete(ctx context.Context, key string) error {
	if err := f.check("delete", key); err != nil {
		return err
	}
	return f.inner.Delete(ctx, key)
}

// Create implements storage.Creator.
func (f *Flaky) Create(ctx context.Context, key string, value []byte) error {
	if err := f.check("create", key); err != nil {
		return err
	}
	if c, ok := f.inner.(storage.Creator); ok {
		return c.Create(ctx, key, value)
	}
	_, err := f.inner.Get(ctx, key)
	switch {
	case err == nil:
		return fmt.Errorf("storagetest: flaky create %q: %w", key, storage.ErrExists)
	case !errors.Is(err, storage.ErrNotFound):
		return err
	}
	return f.inner.Put(ctx, key, value)
}

// PutStream implements storage.StreamPutter.
func (f *Flaky) PutStream(ctx context.Context, key string, r io.Reader) error {
	if err := f.check("put", key); err != nil {
		return err
	}
	if sp, ok := f.inner.(storage.StreamPutter); ok {
		return sp.PutStream(ctx, key, r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("storagetest: flaky put %q: read: %w", key, err)
	}
	return f.inner.Put(ctx, key, b)
}

// Close implements storage.Store; it always reaches the inner store.
func (f *Flaky) Close() error { return f.inner.Close() }
