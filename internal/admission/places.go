package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Queue places: why a job waits and where it is, as queued statuses.

type head struct {
	seq uint64
	id  string
}

// announcement is the last queued status published for a job.
type announcement struct {
	reason   string
	position int
	at       time.Time
}

// announceEvery is how often a tenant's waiting jobs are looked at for
// announcements, and positionEvery how often a waiting job's new place is
// announced when its reason stays the same (see "Why a job waits" in the
// package doc).
const (
	announceEvery = 200 * time.Millisecond
	positionEvery = time.Second
)

// announce publishes a queued status with reason and position for the
// first k jobs of tenant t whose reason or position changed.
func (a *Admitter) announce(ctx context.Context, t, reason string, k int) error {
	n := a.names
	hs := a.heads[t]
	for len(hs) < k {
		from := a.cursor[n.JobSubject(t)]
		if len(hs) > 0 {
			from = hs[len(hs)-1].seq + 1
		}
		raw, err := a.stream.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(n.JobSubject(t)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return err
		}
		id, _ := protocol.ProbeIdentity(raw.Header.Get(protocol.HeaderContentType), raw.Data)
		hs = append(hs, head{seq: raw.Sequence, id: id})
	}
	a.heads[t] = hs
	now := time.Now()
	for i, h := range hs[:min(k, len(hs))] {
		last, seen := a.announced[h.seq]
		switch {
		case !protocol.ValidID(h.id):
			continue
		case seen && last.reason == reason && (last.position == i+1 || now.Sub(last.at) < positionEvery):
			continue // nothing new, or only a place gained since the last second's announcement
		}
		ev := protocol.StatusEvent{V: protocol.SchemaVersion, ID: h.id, Tenant: t, State: protocol.StateQueued,
			JobSeq: h.seq, At: now.UTC(), Reason: reason, Position: i + 1}
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		pm := nats.NewMsg(n.QueryStatus(t, h.id))
		pm.Data = b
		pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		if _, err := a.cfg.JS.PublishMsg(ctx, pm); err != nil {
			return fmt.Errorf("publishing why %s/%s waits: %w", t, h.id, err)
		}
		a.announced[h.seq] = announcement{reason: reason, position: i + 1, at: now}
	}
	return nil
}
