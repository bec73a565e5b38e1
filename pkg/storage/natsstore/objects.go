package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Objects is a storage.Store on a JetStream Object Store bucket, for objects
// of any size (transcripts, journal chunks). See the package doc.
type Objects struct {
	obs     jetstream.ObjectStore
	bucket  string
	options options
}

var (
	_ storage.Store        = (*Objects)(nil)
	_ storage.StreamPutter = (*Objects)(nil)
)

// NewObjects opens the Object Store bucket, creating it (file storage) if it
// does not exist. Options: WithReplicas, WithTimeout.
func NewObjects(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*Objects, error) {
	o := buildOptions(opts)
	ctx, cancel := withDeadline(ctx, o.timeout)
	defer cancel()
	obs, err := openObjects(ctx, js, bucket, o)
	if err != nil {
		return nil, wrap("objects", "open bucket", bucket, err)
	}
	return &Objects{obs: obs, bucket: bucket, options: o}, nil
}

func openObjects(ctx context.Context, js jetstream.JetStream, bucket string, o options) (jetstream.ObjectStore, error) {
	for range 3 {
		obs, err := js.ObjectStore(ctx, bucket)
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return obs, err
		}
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      bucket,
			Description: "agentfleet transcripts",
			Storage:     jetstream.FileStorage,
			Replicas:    o.replicas,
		})
		if !errors.Is(err, jetstream.ErrBucketExists) {
			return obs, err
		}
	}
	return nil, fmt.Errorf("bucket %s keeps appearing and disappearing", bucket)
}

// Bucket returns the bucket name.
func (s *Objects) Bucket() string { return s.bucket }

// Put implements storage.Store.
func (s *Objects) Put(ctx context.Context, key string, value []byte) error {
	return s.put(ctx, key, bytes.NewReader(value))
}

// PutStream implements storage.StreamPutter: r is read in Object Store
// chunks (128 KiB) and never held whole. If r fails, nats.go purges the
// chunks already sent and the previous object, if any, stays.
func (s *Objects) PutStream(ctx context.Context, key string, r io.Reader) error {
	return s.put(ctx, key, r)
}

func (s *Objects) put(ctx context.Context, key string, r io.Reader) error {
	if err := begin(ctx, "objects", "put", key); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	if _, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: key}, ctxReader{ctx: ctx, r: r}); err != nil {
		return wrap("objects", "put", key, err)
	}
	return nil
}

// Get implements storage.Store. The call always carries a deadline.
func (s *Objects) Get(ctx context.Context, key string) ([]byte, error) {
	if err := begin(ctx, "objects", "get", key); err != nil {
		return nil, err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	b, err := s.obs.GetBytes(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, fmt.Errorf("natsstore: objects get %q: %w", key, storage.ErrNotFound)
		}
		return nil, wrap("objects", "get", key, err)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// List implements storage.Store. It reads every object's metadata and keeps
// the names starting with prefix (see the package doc for the cost).
func (s *Objects) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsstore: objects list %q: %w", prefix, err)
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	infos, err := s.obs.List(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoObjectsFound) {
			return nil, nil
		}
		return nil, wrap("objects", "list", prefix, err)
	}
	var keys []string
	for _, info := range infos {
		if !info.Deleted && strings.HasPrefix(info.Name, prefix) && storage.ValidateKey(info.Name) == nil {
			keys = append(keys, info.Name)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// Delete implements storage.Store.
func (s *Objects) Delete(ctx context.Context, key string) error {
	if err := begin(ctx, "objects", "delete", key); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	if err := s.obs.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return wrap("objects", "delete", key, err)
	}
	return nil
}

// Close implements storage.Store; the NATS connection stays open.
func (s *Objects) Close() error { return nil }
