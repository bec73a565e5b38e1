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
// It takes whatever events are queued (up to indexBatch), keeps the newest
// per query (storage.Newer), writes those, then acks the batch; a failed
// write naks that query's events for a retry.
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
	type entry struct {
		ev   protocol.StatusEvent
		msgs []jetstream.Msg
	}
	newest := map[string]*entry{}
	var order []string
	for _, m := range batch {
		var ev protocol.StatusEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
			s.log.Warn().Str("subject", m.Subject()).Msg("unreadable status event; skipping it")
			_ = m.Term()
			continue
		}
		key := storage.StatusKey(ev.Tenant, ev.ID)
		e := newest[key]
		if e == nil {
			e = &entry{ev: ev}
			newest[key] = e
			order = append(order, key)
		} else if storage.Newer(ev, e.ev) {
			e.ev = ev
		}
		e.msgs = append(e.msgs, m)
	}
	for _, key := range order {
		e := newest[key]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := storage.PutStatus(ctx, s.cfg.Status, e.ev)
		cancel()
		for _, m := range e.msgs {
			if err != nil {
				_ = m.NakWithDelay(2 * time.Second)
			} else {
				_ = m.Ack()
			}
		}
		if err != nil {
			s.log.Warn().Err(err).Str("query_id", e.ev.ID).Msg("indexing status failed; will retry")
		}
	}
}
