package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// errFenced stops a run whose job was taken over by a later attempt.
var errFenced = errors.New("worker: a later attempt took over this query")

// journalLog is what the relay needs of a journal log.
type journalLog interface {
	Append(seq uint64, line []byte) error
}

// relay turns agent lines into ordered NATS messages. Every line is first
// appended to the journal (local, durable), then queued for a publisher
// goroutine that publishes asynchronously. The queue is bounded by bytes
// (QueueBytes): only when NATS falls that far behind does the agent's pipe
// wait; the journal holds every line regardless.
type relay struct {
	js         jetstream.JetStream
	subject    string
	tenant, id string
	attempt    int
	maxPayload int // lines larger than this go out as pointers
	journal    journalLog
	metrics    *Metrics
	log        zerolog.Logger
	window     int

	seq    uint64 // last assigned Fleet-Seq; only the emitting goroutine writes it
	fenced func() bool
	// rebase, if set, is called once before the first line: it returns the
	// last Fleet-Seq in the stream, and the relay continues after the higher
	// of that and seq.
	rebase func() (uint64, error)

	mu        sync.Mutex
	cond      *sync.Cond
	queue     []outMsg
	queued    int // bytes in queue
	maxQueued int
	closed    bool
	stopped   bool // run has returned: emit no longer waits for room
	lastErr   error
	done      chan struct{}
	cancel    context.CancelFunc
}

type outMsg struct {
	seq  uint64
	data []byte
}

func newRelay(r *relay) *relay {
	r.cond = sync.NewCond(&r.mu)
	r.done = make(chan struct{})
	if r.maxQueued <= 0 {
		r.maxQueued = 64 << 20
	}
	if r.window <= 0 {
		r.window = 256
	}
	return r
}

// emit journals and queues one line; called from one goroutine, in order.
func (r *relay) emit(line []byte) error {
	if r.fenced != nil && r.fenced() {
		return errFenced
	}
	if r.rebase != nil {
		last, err := r.rebase()
		if err != nil {
			return fmt.Errorf("worker: query %s: reading the last Fleet-Seq: %w", r.id, err)
		}
		r.seq = max(r.seq, last)
		r.rebase = nil
	}
	seq := r.seq + 1
	if err := r.journal.Append(seq, line); err != nil {
		return fmt.Errorf("worker: journal query %s seq %d: %w", r.id, seq, err)
	}
	r.seq = seq
	data := line
	if len(line) > r.maxPayload {
		data = pointer(seq, len(line), storage.LineKey(r.tenant, r.id, seq))
	} else {
		data = append([]byte(nil), line...)
	}
	r.metrics.linesRelayed.Inc()
	r.metrics.bytesRelayed.Add(float64(len(line)))
	r.mu.Lock()
	for r.queued+len(data) > r.maxQueued && len(r.queue) > 0 && !r.closed && !r.stopped {
		r.cond.Wait()
	}
	r.queue = append(r.queue, outMsg{seq: seq, data: data})
	r.queued += len(data)
	r.mu.Unlock()
	r.cond.Broadcast()
	return nil
}

// pointer is the small message that stands for a line too large for NATS.
func pointer(seq uint64, size int, key string) []byte {
	b := make([]byte, 0, 96+len(key))
	b = append(b, `{"type":"x_fleet_large_line","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, int64(size), 10)
	b = append(b, `,"key":`...)
	b = strconv.AppendQuote(b, key)
	return append(b, '}')
}

// start runs the publisher goroutine under ctx. Its owner must call
// shutdown (after flush, or instead of it) before the run ends: that is
// what guarantees the goroutine is gone.
func (r *relay) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	go r.run(ctx)
}

// shutdown closes the relay, stops publishing what is left (the journal
// keeps it) and waits until the publisher goroutine has returned.
func (r *relay) shutdown() {
	r.close()
	r.cancel()
	<-r.done
}

// run publishes queued lines in order until close is called and the queue
// is empty, or ctx ends. Failed publishes are retried with the same
// Nats-Msg-Id, so a message the server did store is not stored twice.
func (r *relay) run(ctx context.Context) {
	defer close(r.done)
	defer func() {
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
		r.cond.Broadcast()
	}()
	// The cond does not know about ctx: wake it when ctx ends.
	stopWake := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.mu.Unlock()
		r.cond.Broadcast()
	})
	defer stopWake()
	type pending struct {
		msg *nats.Msg
		f   jetstream.PubAckFuture
	}
	var inflight []pending
	// reap collects finished publishes in order; with block it waits for
	// the oldest one only, then collects whatever else is already done.
	reap := func(block bool) {
		for len(inflight) > 0 {
			p := inflight[0]
			var err error
			if block {
				select {
				case <-p.f.Ok():
				case err = <-p.f.Err():
				case <-ctx.Done():
					return
				}
			} else {
				select {
				case <-p.f.Ok():
				case err = <-p.f.Err():
				default:
					return
				}
			}
			if err != nil {
				r.metrics.publishErrors.Inc()
				r.republish(ctx, p.msg, err)
			}
			inflight = inflight[1:]
			block = false
		}
	}
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed && ctx.Err() == nil {
			if len(inflight) > 0 {
				break
			}
			r.cond.Wait()
		}
		if ctx.Err() != nil {
			r.mu.Unlock()
			return
		}
		if len(r.queue) == 0 && r.closed && len(inflight) == 0 {
			r.mu.Unlock()
			return
		}
		batch := r.queue
		r.queue = nil
		r.queued = 0
		r.mu.Unlock()
		r.cond.Broadcast()
		if len(batch) == 0 {
			reap(true)
			continue
		}
		for i, m := range batch {
			if r.fenced != nil && r.fenced() {
				// A later attempt owns the query now: what is not yet
				// published is dropped (the journal still has it).
				r.log.Warn().Int("dropped", len(batch)-i).Msg("fenced: not publishing the rest")
				break
			}
			msg := r.message(m)
			for {
				if ctx.Err() != nil {
					return
				}
				f, err := r.js.PublishMsgAsync(msg)
				if err == nil {
					inflight = append(inflight, pending{msg, f})
					break
				}
				if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					// The connection-wide async window is full (other runs
					// share it): wait for our oldest, or briefly.
					if len(inflight) > 0 {
						reap(true)
					} else {
						select {
						case <-time.After(5 * time.Millisecond):
						case <-ctx.Done():
						}
					}
					continue
				}
				r.metrics.publishErrors.Inc()
				r.republish(ctx, msg, err)
				break
			}
			if len(inflight) >= r.window {
				reap(true)
			} else {
				reap(false)
			}
		}
	}
}

func (r *relay) message(m outMsg) *nats.Msg {
	msg := nats.NewMsg(r.subject)
	msg.Data = m.data
	seq := strconv.FormatUint(m.seq, 10)
	msg.Header.Set(protocol.HeaderSeq, seq)
	msg.Header.Set(protocol.HeaderAttempt, strconv.Itoa(r.attempt))
	msg.Header.Set(protocol.HeaderMsgID, protocol.LineMsgID(r.tenant, r.id, r.attempt, m.seq))
	msg.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	return msg
}

// republish retries one message synchronously until it is stored or ctx ends.
func (r *relay) republish(ctx context.Context, msg *nats.Msg, cause error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if r.fenced != nil && r.fenced() {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.js.PublishMsg(pctx, msg)
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			r.setErr(fmt.Errorf("worker: publish %s seq %s: %w", r.subject, msg.Header.Get(protocol.HeaderSeq), cause))
			return
		}
		if attempt == 1 || attempt%20 == 0 {
			r.log.Warn().Err(err).Int("attempt", attempt).Str("seq", msg.Header.Get(protocol.HeaderSeq)).Msg("publish failed; retrying")
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (r *relay) setErr(err error) {
	r.mu.Lock()
	if r.lastErr == nil {
		r.lastErr = err
	}
	r.mu.Unlock()
}

// close says no more lines will come.
func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// flush closes the relay and waits until every queued line is stored in
// the stream (or ctx ends).
func (r *relay) flush(ctx context.Context) error {
	r.close()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("worker: flushing query %s: %w", r.id, ctx.Err())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}
