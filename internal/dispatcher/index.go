package dispatcher

// The status index: every status event in FLEET_QUERIES goes to the status
// store, so status and ls work after restarts.

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// indexLoop keeps the status index: every status event goes to storage.
// It takes whatever events are queued (up to indexBatch), writes the newest
// per query (storage.Newer) in one batch (storage.PutStatuses), then acks
// the batch; a failed write naks the batch's events for a retry.
func (s *Service) indexLoop(cc jetstream.ConsumeContext, q <-chan jetstream.Msg, done chan<- struct{}) {
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
		s.indexBatch(batch)
	}
}

func (s *Service) indexBatch(batch []jetstream.Msg) {
	evs := make([]protocol.StatusEvent, 0, len(batch))
	msgs := batch[:0:0]
	for _, m := range batch {
		var ev protocol.StatusEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
			s.log.Warn().Str("subject", m.Subject()).Msg("unreadable status event; skipping it")
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
	err := storage.PutStatuses(ctx, s.cfg.Status, evs)
	if err != nil {
		s.log.Warn().Err(err).Int("events", len(evs)).Msg("indexing status failed; will retry")
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
		if rerr := s.resumeIfParked(ctx, ev.Tenant, ev.ID); rerr != nil {
			s.log.Warn().Err(rerr).Str("tenant", ev.Tenant).Str("query_id", ev.ID).Msg("resuming a parked session; will retry")
			done[i] = false
		}
	}
	s.mu.Lock()
	adm := s.admitter
	s.mu.Unlock()
	if adm != nil {
		for i, ok := range adm.RecordSpend(ctx, evs) {
			done[i] = done[i] && ok
		}
	} else {
		for i, ev := range evs {
			if ev.State.Terminal() && ev.Result != nil && ev.Result.TotalCostUSD > 0 {
				done[i] = false // no admitter yet (or any more): count it on redelivery
			}
		}
	}
	for i, m := range msgs {
		if done[i] {
			_ = m.Ack()
		} else {
			_ = m.NakWithDelay(2 * time.Second)
		}
	}
}
