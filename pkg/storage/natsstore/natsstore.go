package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// Option configures NewKV and NewObjects.
type Option func(*options)

type options struct {
	replicas int
	timeout  time.Duration
}

// WithReplicas sets the replicas of a bucket created by the constructor
// (default 1). An existing bucket with fewer replicas is raised to n (its
// other settings are kept); one with as many or more keeps its own.
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithTimeout sets the deadline given to calls whose context has none
// (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

func buildOptions(opts []Option) options {
	o := options{replicas: 1, timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.replicas < 1 {
		o.replicas = 1
	}
	if o.timeout <= 0 {
		o.timeout = DefaultTimeout
	}
	return o
}

// withDeadline gives ctx a deadline if it has none.
func withDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// raiseReplicas raises the replicas of the bucket's stream to o.replicas
// if it has fewer, keeping every other setting of the stream (an operator
// may have set limits or placement). A bucket made with one replica, by a
// process started without WithReplicas or before the cluster grew, so
// follows the fleet's --replicas once the dispatcher opens it.
func raiseReplicas(ctx context.Context, js jetstream.JetStream, stream string, o options) error {
	if o.replicas <= 1 {
		return nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	if cfg.Replicas >= o.replicas {
		return nil
	}
	cfg.Replicas = o.replicas
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return err
	}
	// The stream has no leader for a moment while its new peers join; a
	// write sent then gets no acknowledgement and waits out its deadline.
	// So the bucket is handed out once its new group has a leader (the
	// server has no event to wait on for this). Its peers need not all be
	// current: a node may be down, and a leader stores with a quorum.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := s.Info(ctx)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) >= o.replicas-1 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("no leader of the new replicas yet")
			}
			return fmt.Errorf("raising %s to %d replicas: %w: %w", stream, o.replicas, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// begin validates key and checks ctx before any I/O.
func begin(ctx context.Context, what, op, key string) error {
	if err := storage.ValidateKey(key); err != nil {
		return fmt.Errorf("natsstore: %s %s: %w", what, op, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("natsstore: %s %s %q: %w", what, op, key, err)
	}
	return nil
}

// wrap names the operation and adds storage.ErrUnavailable to transient
// failures.
func wrap(what, op, key string, err error) error {
	if unavailable(err) {
		return fmt.Errorf("natsstore: %s %s %q: %w: %w", what, op, key, storage.ErrUnavailable, err)
	}
	return fmt.Errorf("natsstore: %s %s %q: %w", what, op, key, err)
}

func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	for _, e := range []error{
		context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrConnectionClosed, nats.ErrConnectionReconnecting, nats.ErrDisconnected,
		nats.ErrConnectionDraining, jetstream.ErrNoHeartbeat, jetstream.ErrJetStreamNotEnabled,
		jetstream.ErrJetStreamNotEnabledForAccount, jetstream.ErrJetStreamPublisherClosed,
		io.ErrUnexpectedEOF,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return true
	}
	return false
}

// tooLarge reports whether err means the value exceeds a server limit.
func tooLarge(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum)
}

// ctxReader stops a streamed Put when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
