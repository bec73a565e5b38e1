// Package provision creates the fleet's JetStream streams and the work
// consumer. It is idempotent (CreateOrUpdate everywhere), so the dispatcher
// can run it at every start and start order with workers never matters:
// workers wait until the consumer exists.
//
// Streams (names from protocol.Names, default prefix "fleet"):
//
//	FLEET_JOBS        fleet.jobs.>          work queue, file storage, dedupe by Nats-Msg-Id: submitted jobs
//	                  fleet.work.>          the jobs the admitter admitted (internal/admission)
//	FLEET_QUERIES     fleet.query.>         limits, max age (default 7 days): replay of msg/status/ctl
//	FLEET_DLQ         fleet.dlq.>           limits, dead-lettered jobs
//	FLEET_ADVISORIES  max-delivery advisories of the work consumer, kept while the dispatcher is down
//
// Consumer "workers" on FLEET_JOBS, filtered to fleet.work.>: durable pull, explicit ack, AckWait
// (default 30s), MaxDeliver (default 5), MaxAckPending = the fleet-wide
// concurrency, no InactiveThreshold.
package provision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/jsretry"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Config says how to provision.
type Config struct {
	// Names builds stream and subject names. Defaults to the default prefix.
	Names protocol.Names
	// MaxConcurrency is the work consumer's MaxAckPending: never more runs at
	// once across the fleet. Defaults to 64.
	MaxConcurrency int
	// AckWait is the work consumer's ack deadline. Defaults to 30s.
	AckWait time.Duration
	// MaxDeliver is how many attempts a job gets before it is dead-lettered.
	// Defaults to 5.
	MaxDeliver int
	// QueriesMaxAge is how long per-query messages are kept for replay.
	// Defaults to 7 days.
	QueriesMaxAge time.Duration
	// DLQMaxAge is how long dead letters are kept. Defaults to 30 days.
	DLQMaxAge time.Duration
	// DedupeWindow is the Nats-Msg-Id window of the jobs stream. Defaults to 2m.
	DedupeWindow time.Duration
	// MaxWaiting caps outstanding pull requests (one per idle worker); it
	// cannot be changed after creation. Defaults to 4096.
	MaxWaiting int
	// Replicas of every stream (1 for one server, 3 for a cluster). Defaults to 1.
	Replicas int
	// Storage is file or memory. Defaults to file.
	Storage jetstream.StorageType
}

// WithDefaults fills in the defaults of unset fields.
func (c Config) WithDefaults() Config {
	c.MaxConcurrency = cmp.Or(c.MaxConcurrency, 64)
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, 5)
	c.QueriesMaxAge = cmp.Or(c.QueriesMaxAge, 7*24*time.Hour)
	c.DLQMaxAge = cmp.Or(c.DLQMaxAge, 30*24*time.Hour)
	c.DedupeWindow = cmp.Or(c.DedupeWindow, 2*time.Minute)
	c.MaxWaiting = cmp.Or(c.MaxWaiting, 4096)
	c.Replicas = cmp.Or(c.Replicas, 1)
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxConcurrency < 1:
		return errors.New("provision: MaxConcurrency must be at least 1")
	case c.AckWait < time.Second:
		return errors.New("provision: AckWait must be at least 1s")
	case c.MaxDeliver < 1:
		return errors.New("provision: MaxDeliver must be at least 1")
	case c.Replicas < 1 || c.Replicas > 5:
		return errors.New("provision: Replicas must be between 1 and 5")
	}
	return nil
}

// Streams creates or updates the fleet's streams and the work consumer.
func Streams(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	n := cfg.Names
	streams := []jetstream.StreamConfig{
		{
			Name:        n.JobsStream(),
			Description: "agentfleet query jobs (work queue)",
			Subjects:    []string{n.JobsWildcard(), n.WorkWildcard()},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     cfg.Storage,
			Replicas:    cfg.Replicas,
			Discard:     jetstream.DiscardNew,
			Duplicates:  cfg.DedupeWindow,
			MaxMsgSize:  1 << 20,
			// The admitter reads each queued job before it moves it: a
			// direct get answers in binary, without the JSON API's
			// encoding (a lagging replica's answer is safe there: a job
			// copied twice has the same Nats-Msg-Id; internal/admission).
			AllowDirect: true,
		},
		{
			Name:        n.QueriesStream(),
			Description: "agentfleet per-query messages, status and control (replay)",
			Subjects:    []string{n.QueriesWildcard()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     cfg.Storage,
			Replicas:    cfg.Replicas,
			MaxAge:      cfg.QueriesMaxAge,
			// The same window as the jobs': a retried submit's "queued" status
			// is deduped exactly when its job is.
			Duplicates:  min(cfg.DedupeWindow, cfg.QueriesMaxAge),
			AllowDirect: true,
		},
		{
			Name:        n.DLQStream(),
			Description: "agentfleet dead-lettered jobs",
			Subjects:    []string{n.DLQWildcard()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     cfg.Storage,
			Replicas:    cfg.Replicas,
			MaxAge:      cfg.DLQMaxAge,
		},
		{
			Name:        n.AdvisoryStream(),
			Description: "max-delivery advisories of the work consumer, for the dispatcher",
			Subjects:    []string{n.MaxDeliveriesAdvisory()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     cfg.Storage,
			Replicas:    cfg.Replicas,
			MaxAge:      cfg.DLQMaxAge,
		},
	}
	for _, sc := range streams {
		err := Retry(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, sc)
			return err
		})
		if err != nil {
			return fmt.Errorf("provision: stream %s: %w", sc.Name, err)
		}
	}
	if _, err := Consumer(ctx, js, n.JobsStream(), workConsumer(n, cfg)); err != nil {
		return fmt.Errorf("provision: consumer %s: %w", n.Consumer(), err)
	}
	return nil
}

// Consumer creates or updates a durable consumer, through Retry.
func Consumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (c jetstream.Consumer, err error) {
	err = Retry(ctx, func(ctx context.Context) error {
		c, err = js.CreateOrUpdateConsumer(ctx, stream, cfg)
		return err
	})
	return c, err
}

// KeyValue creates or updates a KV bucket, through Retry.
func KeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, err error) {
	err = Retry(ctx, func(ctx context.Context) error {
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	return kv, err
}

// workConsumer is the work consumer's configuration.
func workConsumer(n protocol.Names, cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:     n.Consumer(),
		Description: "agentfleet workers: one admitted job per free slot",
		// Only admitted jobs: the dispatcher's admitter moves them here
		// from <prefix>.jobs.<tenant> (internal/admission).
		FilterSubject: n.WorkWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.MaxConcurrency,
		MaxWaiting:    cfg.MaxWaiting,
		Replicas:      cfg.Replicas,
	}
}

// Retry runs fn, a JetStream API request that is safe to repeat, until it
// succeeds, fails for good, or ctx ends: see jsretry.Do, which the worker
// shares.
func Retry(ctx context.Context, fn func(context.Context) error) error {
	return jsretry.Do(ctx, fn)
}
