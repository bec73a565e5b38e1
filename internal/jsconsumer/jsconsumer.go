package jsconsumer

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InactiveThreshold is how long the server keeps a reader's consumer
// after its last pull when Release did not run (the reader's process died).
const InactiveThreshold = 30 * time.Second

// Ordered opens an ordered consumer on stream over subjects.
func Ordered(ctx context.Context, js jetstream.JetStream, stream string, subjects ...string) (jetstream.Consumer, error) {
	return js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    subjects,
		InactiveThreshold: InactiveThreshold,
	})
}

// Release deletes c's consumer on the server (best effort, bounded), once
// its reader is done with it. c may be nil or not yet created.
func Release(js jetstream.JetStream, stream string, c jetstream.Consumer) {
	if c == nil {
		return
	}
	info := c.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, info.Name)
}
