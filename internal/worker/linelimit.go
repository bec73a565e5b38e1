package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NewLineLimit returns the line size above which a line is relayed as a
// pointer and stored whole under its own key (the worker's relay and its
// journal must agree: give both the same function): LineLimit, or less
// when the stream has a smaller max message size (an operator may create
// FLEET_QUERIES with one; the stream refuses a larger message on every
// try). The stream's limit is read once, when first needed and NATS
// answers within two seconds; until then LineLimit alone counts. The
// connection's max payload is read at each call, so a worker started
// before its server learns it (and a reconnect to another server updates
// it).
func NewLineLimit(nc *nats.Conn, stream string) func() int {
	var streamMax atomic.Int64 // 0: not read yet; -1: none
	return func() int {
		limit := LineLimit(nc)
		sm := streamMax.Load()
		if sm == 0 {
			if js, err := jetstream.New(nc); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				st, err := js.Stream(ctx, stream)
				cancel()
				if err == nil {
					sm = int64(st.CachedInfo().Config.MaxMsgSize)
					if sm <= 0 {
						sm = -1
					}
					streamMax.Store(sm)
				}
			}
		}
		if sm > 0 {
			limit = min(limit, int(sm)-1024)
		}
		return max(limit, 1)
	}
}

// LineLimit is the line size above which a line is relayed as a pointer
// and stored whole under its own key, as far as the connection tells: its
// max payload minus room for headers, or 1 MiB's if it never connected.
func LineLimit(nc *nats.Conn) int {
	mp := nc.MaxPayload()
	if mp <= 0 {
		mp = 1 << 20
	}
	return int(mp) - 1024
}
