package storage

import (
	"context"
	"errors"
	"io"
)

// Store is a flat key/value object store. Keys are '/'-separated paths of
// [A-Za-z0-9._=-] segments, no empty segment, no leading '/', at most 480 bytes.
// Every backend (FS, NATS, S3/R2, Workers KV) implements it and passes
// storagetest.Exercise.
type Store interface {
	// Put writes value under key, replacing any previous value.
	Put(ctx context.Context, key string, value []byte) error
	// Get returns the value of key, or an error wrapping ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// List returns the keys starting with prefix, sorted ascending.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// Close releases the backend's resources.
	Close() error
}

// Creator is implemented by stores that can write a key only if it does not
// exist yet (write-once objects). It returns an error wrapping ErrExists when
// the key exists.
type Creator interface {
	Create(ctx context.Context, key string, value []byte) error
}

// StreamPutter is implemented by stores that can write a large object from a
// reader without holding it in memory (S3 multipart, files).
type StreamPutter interface {
	PutStream(ctx context.Context, key string, r io.Reader) error
}

// Sentinel errors.
var (
	ErrNotFound    = errors.New("storage: not found")
	ErrExists      = errors.New("storage: already exists")
	ErrInvalidKey  = errors.New("storage: invalid key")
	ErrTooLarge    = errors.New("storage: value too large")
	ErrUnavailable = errors.New("storage: unavailable")
)
