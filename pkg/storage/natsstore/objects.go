package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Objects is a storage.Store on a JetStream Object Store bucket, for objects
// of any size (transcripts, journal chunks). See the package doc.
type Objects struct {
	obs     jetstream.ObjectStore
	names   *KV // the name index: one key per object name (see the package doc)
	bucket  string
	options options
}

var (
	_ storage.Store        = (*Objects)(nil)
	_ storage.StreamPutter = (*Objects)(nil)
)

// NewObjects opens the Object Store bucket, creating it (file storage) if it
// does not exist, and its name index, the Key-Value bucket NamesBucket(bucket),
// which it fills from the objects' metadata until one filling has finished.
// Options: WithReplicas, WithTimeout.
func NewObjects(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*Objects, error) {
	o := buildOptions(opts)
	ctx, cancel := withDeadline(ctx, o.timeout)
	defer cancel()
	obs, err := openObjects(ctx, js, bucket, o)
	if err != nil {
		return nil, wrap("objects", "open bucket", bucket, err)
	}
	names, err := openKV(ctx, js, NamesBucket(bucket), "agentfleet object names", o)
	if err != nil {
		return nil, wrap("objects", "open name index", NamesBucket(bucket), err)
	}
	s := &Objects{obs: obs, names: &KV{kv: names, bucket: NamesBucket(bucket), options: o}, bucket: bucket, options: o}
	switch _, err := names.Get(ctx, indexedKey); {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		if err := s.indexExisting(ctx); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, wrap("objects", "open name index", NamesBucket(bucket), err)
	}
	return s, nil
}

// indexedKey, in the name index, says that the index holds the names of
// the objects stored before it existed. No store key maps to it ("." is
// not a valid key), so no List finds it.
const indexedKey = "/"

// NamesBucket is the Key-Value bucket that indexes the names of the objects
// in the Object Store bucket.
func NamesBucket(bucket string) string { return bucket + "_NAMES" }

// indexExisting adds the names of the objects already stored (a bucket
// written before it had a name index) to the index, then marks it filled.
// Until then every NewObjects fills it again: the names are the same.
func (s *Objects) indexExisting(ctx context.Context) error {
	infos, err := s.obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return wrap("objects", "index existing names", s.bucket, err)
	}
	for _, info := range infos {
		if info.Deleted || storage.ValidateKey(info.Name) != nil {
			continue
		}
		if err := s.names.Put(ctx, info.Name, nil); err != nil {
			return err
		}
	}
	if _, err := s.names.kv.Put(ctx, indexedKey, nil); err != nil {
		return wrap("objects", "index existing names", s.bucket, err)
	}
	return nil
}

func openObjects(ctx context.Context, js jetstream.JetStream, bucket string, o options) (jetstream.ObjectStore, error) {
	for range 3 {
		obs, err := js.ObjectStore(ctx, bucket)
		if err == nil {
			err = raiseReplicas(ctx, js, "OBJ_"+bucket, o)
		}
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
	// The name first: an object is never stored without its name in the
	// index, and List checks that a name it finds is an object.
	if err := s.names.Put(ctx, key, nil); err != nil {
		return err
	}
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

// List implements storage.Store. It reads the names under prefix from the
// name index (a subject filter on the server, as KV.List) and keeps those
// that are objects: one metadata read per name found, whatever else the
// bucket holds.
func (s *Objects) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natsstore: objects list %q: %w", prefix, err)
	}
	ctx, cancel := withDeadline(ctx, s.options.timeout)
	defer cancel()
	names, err := s.names.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	keys := names[:0]
	for _, name := range names {
		if storage.ValidateKey(name) != nil {
			continue
		}
		// A name whose Put has not stored the object yet, or whose Delete
		// has not removed the name yet (or died in between), is no object.
		info, err := s.obs.GetInfo(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			continue
		case err != nil:
			return nil, wrap("objects", "list", prefix, err)
		case !info.Deleted:
			keys = append(keys, name)
		}
	}
	return keys, nil
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
	// The name last: see put.
	return s.names.Delete(ctx, key)
}

// Close implements storage.Store; the NATS connection stays open.
func (s *Objects) Close() error { return nil }
