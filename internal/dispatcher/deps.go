package dispatcher

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// queryDeps is what every part works with: the connection, the fleet's
// names, the status and object stores, the logger.
type queryDeps struct {
	nc          *nats.Conn
	js          jetstream.JetStream
	names       protocol.Names
	statusStore storage.Store
	objects     storage.Store
	log         zerolog.Logger
	tracing     *tracing.Tracing // nil: off
}

// publishJSON publishes v as JSON on subject to the stream that holds it,
// with msgID as its Nats-Msg-Id when not "".
func (q queryDeps) publishJSON(ctx context.Context, subject string, v any, msgID string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	pm := nats.NewMsg(subject)
	pm.Data = b
	pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	if msgID != "" {
		pm.Header.Set(protocol.HeaderMsgID, msgID)
	}
	_, err = q.js.PublishMsg(ctx, pm)
	return err
}

// consumed is a running consumer of a part: stop drains it and waits
// until it is closed.
type consumed struct {
	cc jetstream.ConsumeContext
}

func (c *consumed) stop(ctx context.Context) error {
	if c.cc == nil {
		return nil
	}
	cc := c.cc
	c.cc = nil
	cc.Drain()
	select {
	case <-cc.Closed():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
