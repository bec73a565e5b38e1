package main

import (
	"context"
	"errors"
	"net/url"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/storage/s3"
)

// The worker opens only transcript storage (backends.Objects), never
// status records, so it registers s3:// (R2 and any S3) and not the
// Workers KV backend of backends/all: linking the Cloudflare SDK (about a
// hundred packages, their init run at every start) cost the idle worker
// about 5 MB of resident memory for a scheme it can only refuse.
func init() {
	backends.Register("s3", func(ctx context.Context, u *url.URL, _ backends.Role, _ backends.Deps) (storage.Store, error) {
		return s3.Open(ctx, u)
	})
	backends.Register("cfkv", func(context.Context, *url.URL, backends.Role, backends.Deps) (storage.Store, error) {
		return nil, errors.New("storage: cfkv:// is for status records (the dispatcher's --status-storage); the worker stores transcripts: use s3:// (R2) or file://")
	})
}
