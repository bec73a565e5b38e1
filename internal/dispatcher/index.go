package dispatcher

// The status index: every status event in FLEET_QUERIES goes to the status
// store, so status and ls work after restarts. lookup reads it (and the
// stream, which it may lag by a moment).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// statusIndex keeps the status index with the durable consumer
// StatusConsumer, and hands each stored batch to the other readers of
// status events: the sessions (a parked one with input waiting is
// resumed) and the admitter (results' cost goes to their tenants' spend).
type statusIndex struct {
	queryDeps
	sessions *sessions
	adm      *admission.Admitter

	consumed
	done chan struct{} // closed when the index loop has returned
}

func newStatusIndex(q queryDeps, s *sessions, adm *admission.Admitter) *statusIndex {
	return &statusIndex{queryDeps: q, sessions: s, adm: adm}
}

// start makes (or finds) the consumer and starts the index loop.
func (x *statusIndex) start(ctx context.Context) error {
	n := x.names
	idx, err := provision.Consumer(ctx, x.js, n.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       StatusConsumer,
		FilterSubject: n.StatusWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1024,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: status index consumer: %w", err)
	}
	// The index handler only queues; one goroutine drains the queue in
	// batches and writes each query's newest event once per batch, so a
	// busy fleet costs one storage write per query per batch, not one per
	// event.
	q := make(chan jetstream.Msg, 1024)
	cc, err := idx.Consume(func(m jetstream.Msg) { q <- m }, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("dispatcher: status index: %w", err)
	}
	x.cc, x.done = cc, make(chan struct{})
	go x.loop(cc, q, x.done)
	return nil
}

// stop drains the consumer, then waits for the index writer: it ends once
// its consumer is closed, after writing the batch it holds.
func (x *statusIndex) stop(ctx context.Context) error {
	if err := x.consumed.stop(ctx); err != nil {
		return err
	}
	if x.done == nil {
		return nil
	}
	select {
	case <-x.done:
		x.done = nil
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loop keeps the status index: every status event goes to storage.
// It takes whatever events are queued (up to indexBatch), writes the newest
// per query (storage.Newer) in one batch (storage.PutStatuses), then acks
// the batch; a failed write naks the batch's events for a retry.
func (x *statusIndex) loop(cc jetstream.ConsumeContext, q <-chan jetstream.Msg, done chan<- struct{}) {
	defer close(done)
	const (
		indexBatch  = 512
		indexLinger = 100 * time.Millisecond
	)
	for {
		var first jetstream.Msg
		select {
		case first = <-q:
		case <-cc.Closed():
			return
		}
		// Linger a moment so a short query's events (running, then its
		// terminal one) become one write. Lookups also read the stream, so
		// the index may lag this much.
		batch := []jetstream.Msg{first}
		linger := time.NewTimer(indexLinger)
	drain:
		for len(batch) < indexBatch {
			select {
			case m := <-q:
				batch = append(batch, m)
			case <-linger.C:
				break drain
			case <-cc.Closed():
				break drain
			}
		}
		linger.Stop()
		x.batch(batch)
	}
}

func (x *statusIndex) batch(batch []jetstream.Msg) {
	evs := make([]protocol.StatusEvent, 0, len(batch))
	msgs := batch[:0:0]
	for _, m := range batch {
		var ev protocol.StatusEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
			x.log.Warn().Str("subject", m.Subject()).Msg("unreadable status event; skipping it")
			_ = m.Term()
			continue
		}
		evs = append(evs, ev)
		msgs = append(msgs, m)
	}
	// One batch write (storage.PutStatuses: the newest event per query,
	// one filesystem sync on FS) for every event of the batch.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := storage.PutStatuses(ctx, x.statusStore, evs)
	if err != nil {
		x.log.Warn().Err(err).Int("events", len(evs)).Msg("indexing status failed; will retry")
		for _, m := range msgs {
			_ = m.NakWithDelay(2 * time.Second)
		}
		return
	}
	// The other readers of status events read them here, so the server
	// delivers each event to the dispatcher once (not once per reader):
	// a parked session with input waiting is resumed, and results' cost
	// goes to their tenants' spend (admission budgets). Both are
	// idempotent or counted once per delivery; an event one of them could
	// not handle is delivered again.
	done := make([]bool, len(evs))
	for i := range done {
		done[i] = true
	}
	for i, ev := range evs {
		if ev.State != protocol.StateParked {
			continue
		}
		if rerr := x.sessions.resumeIfParked(ctx, ev.Tenant, ev.ID); rerr != nil {
			x.log.Warn().Err(rerr).Str("tenant", ev.Tenant).Str("query_id", ev.ID).Msg("resuming a parked session; will retry")
			done[i] = false
		}
	}
	for i, ok := range x.adm.RecordSpend(ctx, evs) {
		done[i] = done[i] && ok // a cost the admitter could not record yet comes again
	}
	for i, m := range msgs {
		if done[i] {
			_ = m.Ack()
		} else {
			_ = m.NakWithDelay(2 * time.Second)
		}
	}
}

// lookup finds a query's latest status: the index first, then the stream
// (the index may lag behind by a moment).
func (x *statusIndex) lookup(ctx context.Context, ref protocol.QueryRef) (*protocol.StatusEvent, error) {
	var best *protocol.StatusEvent
	if ev, err := storage.GetStatus(ctx, x.statusStore, ref.Tenant, ref.ID); err == nil {
		best = ev
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	if st, err := x.js.Stream(ctx, x.names.QueriesStream()); err == nil {
		if raw, err := st.GetLastMsgForSubject(ctx, x.names.QueryStatus(ref.Tenant, ref.ID)); err == nil {
			var ev protocol.StatusEvent
			if json.Unmarshal(raw.Data, &ev) == nil && (best == nil || storage.Newer(ev, *best)) {
				best = &ev
			}
		}
	}
	if best == nil {
		return nil, storage.ErrNotFound
	}
	return best, nil
}
