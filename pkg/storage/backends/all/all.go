// Package all registers every storage backend that needs an SDK (s3:// for
// R2 and any S3, cfkv:// for Cloudflare Workers KV) with package backends.
// The commands import it for its side effect; code that needs only file://
// and nats:// does not, and so does not link the AWS or Cloudflare SDKs.
package all

import (
	"context"
	"fmt"
	"net/url"

	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/storage/cfkv"
	"github.com/agentfleet/agentfleet/pkg/storage/s3"
)

func init() {
	backends.Register("s3", func(ctx context.Context, u *url.URL, _ backends.Role, _ backends.Deps) (storage.Store, error) {
		return s3.Open(ctx, u)
	})
	backends.Register("cfkv", func(ctx context.Context, u *url.URL, role backends.Role, deps backends.Deps) (storage.Store, error) {
		if role != backends.Status {
			// Workers KV holds small values (25 MiB), is eventually
			// consistent and allows 1 write/s per key: status records only.
			return nil, fmt.Errorf("storage: cfkv:// is for status records (--status-storage); put transcripts in R2 (s3://)")
		}
		return cfkv.Open(ctx, u, deps.Logger)
	})
}
