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

// places is what the leader last said of the waiting jobs: each tenant's
// first jobs (heads), the queued status announced for each, and when each
// tenant's jobs were last looked at.
type places struct {
	heads     map[string][]head
	announced map[uint64]announcement
	rounds    map[string]time.Time // per tenant: the last announcement round
}

func newPlaces() *places {
	return &places{heads: map[string][]head{}, announced: map[uint64]announcement{}, rounds: map[string]time.Time{}}
}

// forget drops what is known of tenant's places: it is read again, and
// announced now.
func (p *places) forget(tenant string) {
	delete(p.heads, tenant)
	delete(p.rounds, tenant)
}

// admitted drops job seq of tenant, admitted, from the places.
func (p *places) admitted(tenant string, seq uint64) {
	if h := p.heads[tenant]; len(h) > 0 && h[0].seq == seq {
		p.heads[tenant] = h[1:]
	} else {
		delete(p.heads, tenant)
	}
	delete(p.announced, seq)
}

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
func (tm *term) announce(ctx context.Context, t, reason string, k int) error {
	n := tm.a.names
	hs := tm.places.heads[t]
	for len(hs) < k {
		from := tm.cursor[n.JobSubject(t)]
		if len(hs) > 0 {
			from = hs[len(hs)-1].seq + 1
		}
		raw, err := tm.a.stream.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(n.JobSubject(t)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return err
		}
		id, _ := protocol.ProbeIdentity(raw.Header.Get(protocol.HeaderContentType), raw.Data)
		hs = append(hs, head{seq: raw.Sequence, id: id})
	}
	tm.places.heads[t] = hs
	now := time.Now()
	for i, h := range hs[:min(k, len(hs))] {
		last, seen := tm.places.announced[h.seq]
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
		if _, err := tm.a.cfg.JS.PublishMsg(ctx, pm); err != nil {
			return fmt.Errorf("publishing why %s/%s waits: %w", t, h.id, err)
		}
		tm.places.announced[h.seq] = announcement{reason: reason, position: i + 1, at: now}
	}
	return nil
}
