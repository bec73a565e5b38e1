package storagetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// ErrClosed is returned by every call on a closed Mem.
var ErrClosed = errors.New("storagetest: store closed")

// Mem is an in-memory storage.Store with Creator and StreamPutter, safe for
// concurrent use. It validates keys like every backend and copies values in
// and out, so callers may reuse their slices. The zero value is not usable;
// call NewMem.
type Mem struct {
	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every write or delete
	closed  bool
}

var (
	_ storage.Store        = (*Mem)(nil)
	_ storage.Creator      = (*Mem)(nil)
	_ storage.StreamPutter = (*Mem)(nil)
)

// NewMem returns an empty Mem.
func NewMem() *Mem {
	return &Mem{data: map[string][]byte{}, changed: make(chan struct{})}
}

func (m *Mem) begin(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mem: %s %q: %w", op, key, err)
	}
	if err := storage.ValidateKey(key); err != nil {
		return fmt.Errorf("mem: %s: %w", op, err)
	}
	return nil
}

// notify wakes Wait callers; m.mu must be held.
func (m *Mem) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Put implements storage.Store.
func (m *Mem) Put(ctx context.Context, key string, value []byte) error {
	if err := m.begin(ctx, "put", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.data[key] = append([]byte{}, value...)
	m.notify()
	return nil
}

// Create implements storage.Creator.
func (m *Mem) Create(ctx context.Context, key string, value []byte) error {
	if err := m.begin(ctx, "create", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.data[key]; ok {
		return fmt.Errorf("mem: create %q: %w", key, storage.ErrExists)
	}
	m.data[key] = append([]byte{}, value...)
	m.notify()
	return nil
}

// PutStream implements storage.StreamPutter. It reads r to the end before
// storing anything, so a failing reader leaves the previous value.
func (m *Mem) PutStream(ctx context.Context, key string, r io.Reader) error {
	if err := m.begin(ctx, "put", key); err != nil {
		return err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("mem: put %q: read: %w", key, err)
	}
	return m.Put(ctx, key, b)
}

// Get implements storage.Store.
func (m *Mem) Get(ctx context.Context, key string) ([]byte, error) {
	if err := m.begin(ctx, "get", key); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	v, ok := m.data[key]
	if !ok {
		return nil, fmt.Errorf("mem: get %q: %w", key, storage.ErrNotFound)
	}
	return append([]byte{}, v...), nil
}

// List implements storage.Store.
func (m *Mem) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mem: list %q: %w", prefix, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	var keys []string
	for k := range m.data {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

// Delete implements storage.Store.
func (m *Mem) Delete(ctx context.Context, key string) error {
	if err := m.begin(ctx, "delete", key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.data[key]; ok {
		delete(m.data, key)
		m.notify()
	}
	return nil
}

// Close implements storage.Store. Later calls fail with ErrClosed; closing
// twice is fine.
func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// Len returns the number of keys held.
func (m *Mem) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.data)
}

// Wait blocks until key exists and returns its value, or until ctx ends.
// Tests use it to wait for an asynchronous writer (a journal flusher, say)
// without sleeping.
func (m *Mem) Wait(ctx context.Context, key string) ([]byte, error) {
	return m.WaitFunc(ctx, key, func([]byte) bool { return true })
}

// WaitFunc blocks until key exists with a value for which ok returns true,
// and returns that value, or until ctx ends.
func (m *Mem) WaitFunc(ctx context.Context, key string, ok func(value []byte) bool) ([]byte, error) {
	for {
		m.mu.Lock()
		v, found := m.data[key]
		ch := m.changed
		m.mu.Unlock()
		if found && ok(v) {
			return append([]byte{}, v...), nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("mem: wait for %q: %w", key, ctx.Err())
		case <-ch:
		}
	}
}
