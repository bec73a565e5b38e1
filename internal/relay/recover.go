package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// errAckTimeout fails a line whose acknowledgement did not come within the
// relay's timeout (sent to a dying leader, or lost with a connection).
var errAckTimeout = errors.New("relay: no acknowledgement from the stream in time")

// refused reports whether err is the stream refusing a line for another
// reason than the fence (its max message size, an account limit, a
// failed write): unlike a lost line, a later line may then be stored.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && !fence.WrongLastSequence(err)
}

// oneConnection reports whether every flight went out on the same
// connection, none through the reconnect buffer. Only then does a stored
// or acknowledged line imply that every line sent before it reached the
// stream: the client drops what it had not written when a connection
// breaks, and the bytes in the dead socket are lost, while a line sent on
// the next connection (or from the reconnect buffer) is stored.
func oneConnection(inflight []flight) bool {
	for _, p := range inflight {
		if p.buffered || p.conn != inflight[0].conn {
			return false
		}
	}
	return true
}

// recover handles a failed publish: it waits until every line in flight is
// resolved, rechecks the fence after a "wrong last sequence", reads the
// query's last line back from the stream leader, and returns what is left
// to send (in order, from the first line not stored) with nothing in
// flight. While NATS is away it keeps retrying the read (with backoff)
// until ctx ends.
func (r *Relay) recover(ctx context.Context, cause error, inflight []flight, pending []outMsg) ([]outMsg, []flight) {
	r.metrics.PublishErrors.Inc()
	wrong := fence.WrongLastSequence(cause)
	// Across a reconnect a line may be stored while an earlier one was
	// lost with the old connection, and a line the stream refused for
	// another reason than the fence (a limit, a failed write) may be
	// followed by a stored one. Then only the lines acknowledged in order
	// are known stored, and the rest is sent again (the stream drops a
	// copy of a stored one by its Nats-Msg-Id); until the first of them
	// is acknowledged (gapFrom), the read back cannot tell either: the
	// last line stored may follow a missing one.
	trust := r.gapFrom == 0 && oneConnection(inflight)
	acked := make([]bool, len(inflight))
	for i, p := range inflight {
		if p.failed {
			trust = trust && !refused(cause)
			continue // its error is the cause
		}
		if err := r.await(ctx, p); err != nil {
			if ctx.Err() != nil {
				for _, q := range inflight[i:] {
					r.pub.Forget(q.a)
				}
				return pending, nil
			}
			continue // timed out: the read below tells
		}
		if p.a.Err != nil {
			wrong = wrong || fence.WrongLastSequence(p.a.Err)
			trust = trust && !refused(p.a.Err)
			continue
		}
		acked[i] = true
	}
	for i, p := range inflight {
		if !acked[i] {
			if !trust {
				break // the lines acknowledged in order end here
			}
			continue // the read below tells
		}
		r.setStoredFreed(p.m.seq, 0) // its bytes are freed below
		r.lastSeq = max(r.lastSeq, p.a.Seq)
	}
	if wrong {
		v, err := r.fence.Recheck(ctx)
		if err != nil {
			return pending, nil // ctx ended
		}
		if v != fence.Proceed {
			r.log.Warn().Str("verdict", v.String()).Msg("fenced by the stream: a later attempt or another writer owns the query")
			r.setFenced()
			return nil, nil
		}
	} else {
		r.log.Warn().Err(cause).Int("in_flight", len(inflight)).Msg("publish failed; checking what the stream has, then sending again in order")
	}
	// The read also waits, with backoff, while NATS is away.
	last, err := r.lastStored(ctx)
	if err != nil {
		return pending, nil // ctx ended
	}
	// Only this goroutine marks lines stored: setStoredFreed below records
	// stored (and acks the journal) once.
	stored := r.storedSeq()
	switch {
	case trust:
		stored = max(last, stored)
	case r.gapFrom == 0:
		r.gapFrom = stored + 1
		r.log.Warn().Uint64("stored", stored).Msg("a line in flight may be missing while a later one is stored (a reconnect, or a line the stream refused): sending again every line after the last one acknowledged in order")
	}
	if refused(cause) {
		// The stream refused a line (a limit, a failed write): the same
		// line goes again, after a pause that doubles while it is
		// refused (up to the relay's timeout).
		r.refusedWait = min(max(2*r.refusedWait, 20*time.Millisecond), r.timeout)
		if err := sleepCtx(ctx, r.refusedWait); err != nil {
			return pending, nil
		}
	}
	rest := make([]outMsg, 0, len(inflight)+len(pending))
	freed := 0
	for _, p := range inflight {
		if p.m.seq > stored {
			rest = append(rest, p.m)
		} else {
			freed += len(p.m.data)
		}
	}
	for _, m := range pending {
		if m.seq > stored {
			rest = append(rest, m)
		} else {
			freed += len(m.data)
		}
	}
	r.setStoredFreed(stored, freed)
	return rest, nil
}

// await waits until p's acknowledgement arrives (nil), its timeout passes
// since it was sent (errAckTimeout; it is forgotten), or ctx ends.
func (r *Relay) await(ctx context.Context, p flight) error {
	defer func() {
		if r.ackTimer != nil {
			r.ackTimer.Stop()
		}
	}()
	for !p.a.Done() {
		left := time.Until(p.sent.Add(r.timeout))
		if left <= 0 {
			r.pub.Forget(p.a)
			if p.a.Done() {
				return nil // it came as it was forgotten
			}
			return fmt.Errorf("%w (%s)", errAckTimeout, r.timeout)
		}
		if r.ackTimer == nil {
			r.ackTimer = time.NewTimer(left)
		} else {
			r.ackTimer.Reset(left) // no stale fire to drain since Go 1.23
		}
		select {
		case <-r.acked:
		case <-r.ackTimer.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// lastStored reads the query's last line from the stream leader and returns
// its Fleet-Seq if this attempt wrote it (after the claim no other attempt
// can), else base. It retries until the stream answers or ctx ends.
func (r *Relay) lastStored(ctx context.Context) (uint64, error) {
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, r.timeout)
		m, err := fence.LastMsg(rctx, r.nc, r.stream, r.subject)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return r.base, nil
		case err == nil:
			seq, _ := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64)
			att, _ := strconv.Atoi(m.Header.Get(protocol.HeaderAttempt))
			if att == r.attempt && seq > r.base {
				return seq, nil
			}
			return r.base, nil
		}
		if try == 1 || try%20 == 0 {
			r.log.Warn().Err(err).Int("try", try).Msg("reading the query's last line back; retrying")
		}
		if err := sleepCtx(ctx, backoff); err != nil {
			return 0, err
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
