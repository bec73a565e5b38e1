package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/jspub"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// ErrFenced stops a run whose job was taken over by a later attempt (or
// that another writer ended).
var ErrFenced = errors.New("relay: a later attempt took over this query")

// Journal is what the relay needs of a journal log: Append before
// publishing a line, Ack once the stream stored it (a memory-first
// journal then forgets it).
type Journal interface {
	AppendOwned(seq uint64, line []byte) error
	AppendWhole(seq uint64, line []byte) error
	Ack(seq uint64)
}

// Relay turns agent lines into ordered NATS messages. Every line is first
// appended to the journal, then queued for a publisher goroutine that
// publishes asynchronously (package jspub: acknowledgements on the
// worker's one reply subscription, read without reflection), up to window
// lines in flight; a line not acknowledged within timeout fails. The
// lines not yet stored (queued or in flight) are bounded by bytes
// (QueueBytes, below the journal's SpillBytes): beyond it the agent's pipe
// waits. So an agent writing faster than the stream stores is slowed to
// the stream's pace instead of spilling the journal to disk, while lines
// NATS does not acknowledge within the journal's SpillAfter (NATS away)
// still spill.
//
// Lines that queue up (16 or more: an agent writing faster than one
// acknowledgement each would carry) go out as a group instead (up to
// 1,024), on a stream of one replica: nothing else in flight, every line
// but the last without a reply subject, the last with one, then one count
// of the query's lines stored since the last line known stored
// (sendGroup). The stream sends one acknowledgement per group instead of
// one per line, and the relay handles one; the count catches a line the
// stream refused without a word, or one lost on the way, and then the
// group goes again one acknowledgement each. A job's few lines go one
// acknowledgement each, as before.
//
// Each line carries the attempt's fence (see package fence): it is stored
// only while the query's last status is this attempt's own. When a publish
// fails (an error, a PubAck timeout, a disconnect), the relay stops sending,
// waits for every line in flight to resolve, reads the query's last line
// back from the stream leader (after the claim it can only be this
// attempt's), and sends again from the first line not stored, in order. A
// line is therefore never lost and never stored after a later attempt's
// claim.
//
// The read back proves every line up to the last one stored only while
// the lines in flight all went out on one connection: when a connection
// breaks, nats.go drops what it had not yet written and sends what was
// published meanwhile (its reconnect buffer) on the next one, so a line can
// be stored while an earlier one was lost. A flight records its connection
// (send); when the lines in flight span more than one, recover counts only
// those acknowledged in order, and sends the rest again (the stream drops
// the copy of one it has, by Nats-Msg-Id), trusting no read back until the
// first of them is acknowledged. The same holds when the stream refused a
// line for another reason than the fence (a limit, a failed write) and
// stored a later one; the refused line goes again after a pause that
// doubles while it is refused. Only then is a line stored after a later
// one (in the stream; transcripts and Fleet-Seq keep the agent's order) or,
// after an outage longer than the stream's duplicate window, twice.
type Relay struct {
	pub        *jspub.Publisher // the worker's: lines' acknowledgements
	nc         *nats.Conn
	stream     string // FLEET_QUERIES
	subject    string
	tenant, id string
	attempt    int
	maxPayload int // lines larger than this go out as pointers
	journal    Journal
	metrics    *Metrics
	log        zerolog.Logger
	window     int
	fence      *fence.Writer
	// base is the query's last Fleet-Seq before this attempt.
	base uint64
	// hint, if set, reports a later attempt seen on the status
	// subscription: a shortcut; the server's check is what fences.
	hint func() bool
	// timeout bounds each line's wait for its acknowledgement and each
	// read of the last line.
	timeout time.Duration
	// acked gets a value when an acknowledgement of this relay's arrives.
	acked chan struct{}

	seq uint64    // last assigned Fleet-Seq; only the emitting goroutine writes it
	msg *nats.Msg // reused by message, on the publisher goroutine
	// token is the fence token msg carries.
	token uint64
	// ackTimer times await out; the publisher goroutine reuses it.
	ackTimer *time.Timer
	// gapFrom, when not 0, is the first line that may be missing from the
	// stream while a later one is stored (see recover); the publisher
	// goroutine alone uses it.
	gapFrom uint64
	// direct counts a group's lines in the stream (sendGroup); nil sends
	// no groups.
	direct *directget.Mux
	// groupMin is the fewest lines queued that go out as a group
	// (sendGroup); 0 sends no groups.
	groupMin int
	// lastSeq is the highest stream sequence of a line of this relay
	// known stored; the publisher goroutine alone uses it.
	lastSeq uint64
	// refusedWait is the pause before a line the stream refused goes
	// again; the publisher goroutine alone uses it, and a line stored
	// resets it.
	refusedWait time.Duration

	mu        sync.Mutex
	cond      *sync.Cond
	queue     []outMsg
	held      int // bytes of the lines emitted and not yet known stored
	maxQueued int // bound on held
	closed    bool
	stopped   bool // run has returned: emit no longer waits for room
	fenced    bool
	stored    uint64 // highest Fleet-Seq known to be in the stream
	lastErr   error
	done      chan struct{}
	cancel    context.CancelFunc
}

type outMsg struct {
	seq  uint64
	data []byte
}

type flight struct {
	m    outMsg
	a    *jspub.Ack
	sent time.Time
	// conn is the connection the line went out on: the client's
	// reconnect count when it was published.
	conn uint64
	// buffered: the line may have waited in the client's reconnect
	// buffer (the connection was down, or changed, as it was published),
	// to be sent after lines lost with the old connection.
	buffered bool
	// failed is set once the flight's error was taken as a cause.
	failed bool
}

// Config is one attempt's relay.
type Config struct {
	// Pub publishes the lines; its one reply subscription gets their
	// acknowledgements (the worker's).
	Pub *jspub.Publisher
	NC  *nats.Conn
	// Stream is FLEET_QUERIES, Subject the query's .msg subject.
	Stream, Subject string
	Tenant, ID      string
	Attempt         int
	// MaxPayload is the size above which a line goes out as a pointer and
	// the journal stores it whole.
	MaxPayload int
	Journal    Journal
	Metrics    *Metrics
	Log        zerolog.Logger
	// Window is how many lines may be in flight (default 256; 1 on a
	// replicated stream).
	Window int
	// MaxQueued bounds the bytes of lines not yet known stored; beyond it
	// Emit waits (default 64 MiB).
	MaxQueued int
	// Base is the query's last Fleet-Seq before this attempt.
	Base uint64
	// Fence is the attempt's fence: every line carries its token.
	Fence *fence.Writer
	// Hint, if set, reports the attempt fenced: a shortcut; the server's
	// check is what fences.
	Hint func() bool
	// Timeout bounds each line's wait for its acknowledgement and each
	// read of the last line (default 5s).
	Timeout time.Duration
	// Direct counts a group's lines; nil sends no groups.
	Direct *directget.Mux
	// GroupMin is the fewest queued lines that go out as a group (the
	// package's GroupMin; 0 sends no groups).
	GroupMin int
}

// New returns the relay of cfg; Start starts its publisher.
func New(cfg Config) *Relay {
	return newRelay(&Relay{
		pub: cfg.Pub, nc: cfg.NC, stream: cfg.Stream, subject: cfg.Subject, tenant: cfg.Tenant, id: cfg.ID,
		attempt: cfg.Attempt, maxPayload: cfg.MaxPayload, journal: cfg.Journal, metrics: cfg.Metrics, log: cfg.Log,
		window: cfg.Window, maxQueued: cfg.MaxQueued, base: cfg.Base, fence: cfg.Fence, hint: cfg.Hint,
		timeout: cfg.Timeout, direct: cfg.Direct, groupMin: cfg.GroupMin,
	})
}

// Seq is the last Fleet-Seq the relay assigned (the query's last line once
// Flush succeeded). Call it from the goroutine that emits.
func (r *Relay) Seq() uint64 { return r.seq }

func newRelay(r *Relay) *Relay {
	r.cond = sync.NewCond(&r.mu)
	r.done = make(chan struct{})
	r.acked = make(chan struct{}, 1)
	if r.maxQueued <= 0 {
		r.maxQueued = 64 << 20
	}
	if r.window <= 0 {
		r.window = 256
	}
	if r.timeout <= 0 {
		r.timeout = 5 * time.Second
	}
	r.seq = r.base
	r.stored = r.base
	return r
}

// isFenced reports whether the relay must not publish any more.
func (r *Relay) isFenced() bool {
	if r.hint != nil && r.hint() {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenced
}

// Emit journals and queues one line; called from one goroutine, in order.
func (r *Relay) Emit(line []byte) error {
	if r.isFenced() {
		return ErrFenced
	}
	seq := r.seq + 1
	// A line that fits goes out as this copy, which the journal shares
	// (it never changes); a larger one goes out as a pointer, and the
	// journal copies it.
	var data []byte
	var err error
	if len(line) > r.maxPayload {
		err = r.journal.AppendWhole(seq, line)
	} else {
		data = append([]byte(nil), line...)
		err = r.journal.AppendOwned(seq, data)
	}
	if err != nil {
		if !errors.Is(err, journal.ErrNoSpace) || len(line) > r.maxPayload {
			return fmt.Errorf("relay: journal query %s seq %d: %w", r.id, seq, err)
		}
		// The journal's disk is full: the line still goes to NATS, where
		// FLEET_QUERIES keeps it and the archiver stores it in the
		// transcript. (A line too large for NATS has no such way, above.)
		r.metrics.LinesNotJournaled.Inc()
		r.metrics.JournalFull.Set(1)
	}
	r.seq = seq
	if len(line) > r.maxPayload {
		data = pointer(seq, len(line), storage.LineKey(r.tenant, r.id, seq))
	}
	r.metrics.LinesRelayed.Inc()
	r.metrics.BytesRelayed.Add(float64(len(line)))
	r.mu.Lock()
	for r.held+len(data) > r.maxQueued && r.held > 0 && !r.closed && !r.fenced && !r.stopped {
		r.cond.Wait()
	}
	if r.fenced {
		r.mu.Unlock()
		return ErrFenced
	}
	r.queue = append(r.queue, outMsg{seq: seq, data: data})
	r.held += len(data)
	wake := len(r.queue) == 1 // the publisher may be waiting for lines
	r.mu.Unlock()
	if wake {
		r.cond.Broadcast()
	}
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

// wake unblocks every wait on the relay's condition.
func (r *Relay) wake() {
	r.mu.Lock()
	//lint:ignore SA2001 an empty critical section orders the broadcast after any waiter's check
	r.mu.Unlock()
	r.cond.Broadcast()
}

// take waits for queued lines and returns them; nil once the relay is
// closed and empty, fenced, or ctx ended.
func (r *Relay) take(ctx context.Context) []outMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.queue) == 0 && !r.closed && !r.fenced && ctx.Err() == nil {
		r.cond.Wait()
	}
	if r.fenced || ctx.Err() != nil {
		return nil
	}
	batch := r.queue
	r.queue = nil
	return batch
}

// Start runs the publisher goroutine under ctx. Its owner must call
// Shutdown (after flush, or instead of it) before the run ends: that is
// what guarantees the goroutine is gone.
func (r *Relay) Start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	go r.run(ctx)
}

// Shutdown closes the relay, stops publishing what is left (the journal
// keeps it) and waits until the publisher goroutine has returned.
func (r *Relay) Shutdown() {
	r.close()
	r.cancel()
	<-r.done
}

func (r *Relay) drop(n int) {
	if n > 0 {
		r.log.Warn().Int("dropped", n).Msg("fenced: not publishing the rest (the journal keeps it)")
	}
}

// setStoredFreed marks every line up to seq stored and releases freed
// bytes of the bound on held lines, waking an emit waiting for room.
func (r *Relay) setStoredFreed(seq uint64, freed int) {
	if r.gapFrom != 0 && seq >= r.gapFrom {
		r.gapFrom = 0 // acknowledged in order: no gap below it
	}
	r.mu.Lock()
	if seq > r.stored {
		r.refusedWait = 0
	}
	r.stored = max(r.stored, seq)
	r.held -= freed
	r.mu.Unlock()
	r.journal.Ack(seq)
	if freed > 0 {
		r.cond.Broadcast()
	}
}

func (r *Relay) storedSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored
}

func (r *Relay) setFenced() {
	r.mu.Lock()
	r.fenced = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

func (r *Relay) setErr(err error) {
	r.mu.Lock()
	if r.lastErr == nil {
		r.lastErr = err
	}
	r.mu.Unlock()
}

// close says no more lines will come.
func (r *Relay) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Flush closes the relay and waits until every line is stored in the
// stream. It fails if that did not happen: ctx ended, the relay's context
// ended first, or the attempt was fenced (ErrFenced).
func (r *Relay) Flush(ctx context.Context) error {
	r.close()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("relay: flushing query %s: %w", r.id, ctx.Err())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.fenced:
		return ErrFenced
	case r.lastErr != nil:
		return r.lastErr
	case r.stored < r.seq:
		return fmt.Errorf("relay: flushing query %s: %d of %d lines stored", r.id, r.stored-r.base, r.seq-r.base)
	}
	return nil
}
