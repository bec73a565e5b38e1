package natsstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// KV is a storage.Store on a JetStream Key-Value bucket, for small records
// (status). See the package doc for the key mapping and limits.
type KV struct {
	kv      jetstream.KeyValue
	bucket  string
	options options
}

var (
	_ storage.Store   = (*KV)(nil)
	_ storage.Creator = (*KV)(nil)
)

// NewKV opens the Key-Value bucket, creating it (file storage, history 1) if
// it does not exist. Options: WithReplicas, WithTimeout.
func NewKV(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*KV, error) {
	o := buildOptions(opts)
	ctx, cancel := withDeadline(ctx, o.timeout)
	defer cancel()
	kv, err := openKV(ctx, js, bucket, "agentfleet status records", o)
	if err != nil {
		return nil, wrap("kv", "open bucket", bucket, err)
	}
	return &KV{kv: kv, bucket: bucket, options: o}, nil
}

func openKV(ctx context.Context, js jetstream.JetStream, bucket, description string, o options) (jetstream.KeyValue, error) {
	for range 3 {
		kv, err := js.KeyValue(ctx, bucket)
		if err == nil {
			err = raiseReplicas(ctx, js, "KV_"+bucket, o)
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return kv, err
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: description,
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    o.replicas,
		})
		if !errors.Is(err, jetstream.ErrBucketExists) {
			return kv, err
		}
		// Another process created it first: open it.
	}
	return nil, fmt.Errorf("bucket %s keeps appearing and disappearing", bucket)
}

// Bucket returns the bucket name.
func (s *KV) Bucket() string { return s.bucket }

// kvKey maps a store key to a KV key by swapping '/' and '.'.
func kvKey(key string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '/':
			return '.'
		case '.':
			return '/'
		}
		return r
	}, key)
}

// storeKey is the inverse of kvKey (the swap is its own inverse).
func storeKey(k string) string { return kvKey(k) }

// Put implements storage.Store.
func (s *KV) Put(ctx context.Context, key string, value []byte) error {
	if err := begin(ctx, "kv", "put", key); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	if _, err := s.kv.Put(ctx, kvKey(key), value); err != nil {
		if tooLarge(err) {
			return fmt.Errorf("natsstore: kv put %q (%d bytes): %w: %w", key, len(value), storage.ErrTooLarge, err)
		}
		return wrap("kv", "put", key, err)
	}
	return nil
}

// Create implements storage.Creator with kv.Create, which is atomic on the
// server (it also succeeds over a deleted key).
func (s *KV) Create(ctx context.Context, key string, value []byte) error {
	if err := begin(ctx, "kv", "create", key); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	if _, err := s.kv.Create(ctx, kvKey(key), value); err != nil {
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			return fmt.Errorf("natsstore: kv create %q: %w", key, storage.ErrExists)
		case tooLarge(err):
			return fmt.Errorf("natsstore: kv create %q (%d bytes): %w: %w", key, len(value), storage.ErrTooLarge, err)
		}
		return wrap("kv", "create", key, err)
	}
	return nil
}

// Get implements storage.Store.
func (s *KV) Get(ctx context.Context, key string) ([]byte, error) {
	if err := begin(ctx, "kv", "get", key); err != nil {
		return nil, err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	e, err := s.kv.Get(ctx, kvKey(key))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil, fmt.Errorf("natsstore: kv get %q: %w", key, storage.ErrNotFound)
		}
		return nil, wrap("kv", "get", key, err)
	}
	v := e.Value()
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// List implements storage.Store. The part of prefix up to its last '/'
// becomes a subject filter evaluated by the server; the rest is matched here.
func (s *KV) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsstore: kv list %q: %w", prefix, err)
	}
	filter := ">"
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dir := prefix[:i]
		if storage.ValidateKey(dir) != nil {
			return nil, nil // no valid key starts with prefix
		}
		filter = kvKey(dir) + ".>"
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	lister, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, wrap("kv", "list", prefix, err)
	}
	defer func() { _ = lister.Stop() }()
	var keys []string
	for k := range lister.Keys() {
		if key := storeKey(k); strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	// The lister ends early, without an error, when ctx ends.
	if err := ctx.Err(); err != nil {
		return nil, wrap("kv", "list", prefix, err)
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// Delete implements storage.Store. It purges the key, so no old revision
// stays behind.
func (s *KV) Delete(ctx context.Context, key string) error {
	if err := begin(ctx, "kv", "delete", key); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	if err := s.kv.Purge(ctx, kvKey(key)); err != nil {
		return wrap("kv", "delete", key, err)
	}
	return nil
}

// Close implements storage.Store; the NATS connection stays open.
func (s *KV) Close() error { return nil }
