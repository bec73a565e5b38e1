package relay

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// send publishes m and returns its flight, recording which connection it
// went out on.
func (r *Relay) send(m outMsg) (flight, error) {
	conn := r.nc.Stats().Reconnects
	a, err := r.pub.Publish(r.message(m), r.acked)
	if err != nil {
		return flight{}, err
	}
	buffered := !r.nc.IsConnected() || r.nc.Stats().Reconnects != conn
	return flight{m: m, a: a, sent: time.Now(), conn: conn, buffered: buffered}, nil
}

// run publishes queued lines in order until the relay is closed and every
// line is stored, it is fenced, or ctx ends.
func (r *Relay) run(ctx context.Context) {
	defer close(r.done)
	defer r.markStopped()
	stopWake := context.AfterFunc(ctx, r.wake)
	defer stopWake()
	p := &publisher{r: r}
	// Acknowledgements never awaited again (the run ends) are forgotten.
	defer p.forget()
	for {
		if ctx.Err() != nil {
			r.setErr(fmt.Errorf("relay: relaying query %s: %w", r.id, context.Cause(ctx)))
			return
		}
		if r.isFenced() {
			r.setFenced()
			r.drop(len(p.pending) + len(p.inflight))
			return
		}
		switch {
		case len(p.pending) == 0:
			if p.refill(ctx) {
				return
			}
		case r.grouping(len(p.pending)):
			p.group(ctx)
		default:
			p.sendOne(ctx)
		}
	}
}

// markStopped says the publisher has returned: Emit no longer waits for
// room.
func (r *Relay) markStopped() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// publisher is the state of the relay's publisher goroutine: the lines
// taken from the queue and not yet sent, and those sent and not yet
// resolved, both in order.
type publisher struct {
	r        *Relay
	pending  []outMsg // to send, in order
	inflight []flight // sent, not resolved, in order
}

// forget drops the acknowledgements of the lines still in flight.
func (p *publisher) forget() {
	for _, f := range p.inflight {
		p.r.pub.Forget(f.a)
	}
}

// recover hands a failed publish to the relay's recover.
func (p *publisher) recover(ctx context.Context, err error) {
	p.pending, p.inflight = p.r.recover(ctx, err, p.inflight, p.pending)
}

// refill runs when nothing is pending: it collects what is done in
// flight (waiting for the oldest only when nothing new is queued), then
// takes the queued lines. It reports true once the relay is closed and
// every line is resolved.
func (p *publisher) refill(ctx context.Context) (finished bool) {
	r := p.r
	if len(p.inflight) > 0 {
		if err := p.resolve(ctx, false); err != nil {
			p.recover(ctx, err)
			return false
		}
		r.mu.Lock()
		idle := len(r.queue) == 0
		r.mu.Unlock()
		if idle {
			if err := p.resolve(ctx, true); err != nil {
				p.recover(ctx, err)
			}
			return false
		}
	}
	p.pending = r.take(ctx)
	if p.pending != nil {
		return false
	}
	r.mu.Lock()
	closed := r.closed && len(r.queue) == 0
	r.mu.Unlock()
	return closed && len(p.inflight) == 0
}

// group sends the pending lines as a group (sendGroup), with nothing else
// in flight: its count must find only its own lines.
func (p *publisher) group(ctx context.Context) {
	r := p.r
	if err := p.resolveAll(ctx); err != nil {
		p.recover(ctx, err)
		return
	}
	n := min(len(p.pending), max(r.window, groupMax))
	if err := r.sendGroup(ctx, p.pending[:n]); err != nil {
		p.pending, p.inflight = r.recover(ctx, err, nil, p.pending)
		return
	}
	if r.gapFrom != 0 {
		return // the lines go again, one acknowledgement each
	}
	freed := 0 // every line of the group is stored
	for _, m := range p.pending[:n] {
		freed += len(m.data)
	}
	r.setStoredFreed(p.pending[n-1].seq, freed)
	p.pending = p.pending[n:]
}

// sendOne sends the first pending line, then collects what is done in
// flight, waiting for the oldest when the window is full.
func (p *publisher) sendOne(ctx context.Context) {
	r := p.r
	if !r.nc.IsConnected() {
		// Never let a line wait in the client's reconnect buffer while
		// an earlier one may be lost with the old connection.
		p.recover(ctx, nats.ErrDisconnected)
		return
	}
	f, err := r.send(p.pending[0])
	if err != nil {
		p.recover(ctx, err)
		return
	}
	p.inflight = append(p.inflight, f)
	p.pending = p.pending[1:]
	if err := p.resolve(ctx, len(p.inflight) >= r.window); err != nil {
		p.recover(ctx, err)
	}
}

// resolve collects finished publishes from the oldest on; with block it
// waits for the oldest first. It returns the first error met. What it
// collects is marked stored (and acked to the journal) once.
func (p *publisher) resolve(ctx context.Context, block bool) error {
	r := p.r
	var last uint64
	freed := 0
	defer func() {
		if last > 0 {
			r.setStoredFreed(last, freed)
		}
	}()
	for len(p.inflight) > 0 {
		f := p.inflight[0]
		if !f.a.Done() {
			if !block {
				return nil
			}
			if err := r.await(ctx, f); err != nil {
				if ctx.Err() == nil {
					p.inflight[0].failed = true
				}
				return err
			}
		}
		if f.a.Err != nil {
			p.inflight[0].failed = true
			return f.a.Err
		}
		last, freed = f.m.seq, freed+len(f.m.data)
		r.lastSeq = max(r.lastSeq, f.a.Seq)
		p.inflight = p.inflight[1:]
		block = false
	}
	return nil
}

// resolveAll waits until nothing is in flight.
func (p *publisher) resolveAll(ctx context.Context) error {
	for len(p.inflight) > 0 {
		if err := p.resolve(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// message is m as a NATS message. The relay goroutine alone calls it and
// publishes the result before the next call, so one message and its
// header map serve every line: only the values that change are set.
func (r *Relay) message(m outMsg) *nats.Msg {
	token := r.fence.Token()
	if r.msg == nil {
		r.msg = nats.NewMsg(r.subject)
		r.msg.Header.Set(protocol.HeaderAttempt, strconv.Itoa(r.attempt))
		r.msg.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		r.msg.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, r.fence.Subject())
		r.msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(token, 10))
		r.token = token
	}
	msg := r.msg
	msg.Data = m.data
	setHeader(msg.Header, protocol.HeaderSeq, strconv.FormatUint(m.seq, 10))
	setHeader(msg.Header, protocol.HeaderMsgID, protocol.LineMsgID(r.tenant, r.id, r.attempt, m.seq))
	if token != r.token {
		r.token = token
		setHeader(msg.Header, jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(token, 10))
	}
	return msg
}

// setHeader sets key to v reusing the value's slice (nats.Header.Set
// allocates a new one each time).
func setHeader(h nats.Header, key, v string) {
	if vs := h[key]; len(vs) == 1 {
		vs[0] = v
		return
	}
	h[key] = []string{v}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
