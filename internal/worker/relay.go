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

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/jspub"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// errFenced stops a run whose job was taken over by a later attempt (or
// that another writer ended).
var errFenced = errors.New("worker: a later attempt took over this query")

// journalLog is what the relay needs of a journal log: Append before
// publishing a line, Ack once the stream stored it (a memory-first
// journal then forgets it).
type journalLog interface {
	AppendOwned(seq uint64, line []byte) error
	AppendWhole(seq uint64, line []byte) error
	Ack(seq uint64)
}

// errAckTimeout fails a line whose acknowledgement did not come within the
// relay's timeout (sent to a dying leader, or lost with a connection).
var errAckTimeout = errors.New("worker: no acknowledgement from the stream in time")

// relay turns agent lines into ordered NATS messages. Every line is first
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
type relay struct {
	pub        *jspub.Publisher // the worker's: lines' acknowledgements
	nc         *nats.Conn
	stream     string // FLEET_QUERIES
	subject    string
	tenant, id string
	attempt    int
	maxPayload int // lines larger than this go out as pointers
	journal    journalLog
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

// send publishes m and returns its flight, recording which connection it
// went out on.
func (r *relay) send(m outMsg) (flight, error) {
	conn := r.nc.Stats().Reconnects
	a, err := r.pub.Publish(r.message(m), r.acked)
	if err != nil {
		return flight{}, err
	}
	buffered := !r.nc.IsConnected() || r.nc.Stats().Reconnects != conn
	return flight{m: m, a: a, sent: time.Now(), conn: conn, buffered: buffered}, nil
}

// groupMin is the fewest queued lines the worker's relay sends as a group
// (sendGroup): a job's few lines go one acknowledgement each, with no
// count to read after them.
const groupMin = 16

// groupMax is the most lines in one group (or the window, if larger): a
// group ends with a wait for the stream to catch up (its acknowledgement
// and count), which larger groups pay less often. In the relay benchmark
// groups of up to 256 lines gave no more lines per second than one
// acknowledgement each; 1,024 gave 5-10% more, 4,096 no more than 1,024.
const groupMax = 1024

// grouping reports whether the queued lines go out as a group.
func (r *relay) grouping(queued int) bool {
	return r.groupMin > 0 && queued >= r.groupMin && r.window > 1 && r.gapFrom == 0 && r.direct != nil
}

// sendGroup publishes lines, nothing else of the relay's in flight: all
// but the last without a reply subject (the stream stores them and sends
// no acknowledgement), the last with one, and once that one is
// acknowledged it counts the query's lines stored since the last line
// known stored (one direct get). The acknowledgement says the stream has
// handled every earlier line of the connection; the count, that it stored
// them all (it says nothing of a line it refused, or one lost on the
// way). It returns with gapFrom unset when the count is right; otherwise
// (an error, a short count) gapFrom stays set and the group's lines go
// again one acknowledgement each, the stream dropping the copies of those
// it has.
//
// This saves the stream an acknowledgement per line and the relay the
// handling of one: one acknowledgement and one get for the whole group.
func (r *relay) sendGroup(ctx context.Context, lines []outMsg) error {
	from := max(r.fence.Token(), r.lastSeq) + 1
	conn := r.nc.Stats().Reconnects
	r.gapFrom = lines[0].seq // until the group is counted whole
	defer func() {
		result := "stored"
		if r.gapFrom != 0 {
			result = "resent"
		}
		r.metrics.lineGroups.WithLabelValues(result).Inc()
	}()
	last := len(lines) - 1
	for _, m := range lines[:last] {
		msg := r.message(m)
		msg.Reply = ""
		if err := r.nc.PublishMsg(msg); err != nil {
			return err
		}
	}
	f, err := r.send(lines[last])
	if err != nil {
		return err
	}
	if err := r.await(ctx, f); err != nil {
		return err
	}
	if f.a.Err != nil {
		return f.a.Err
	}
	if f.buffered || f.conn != conn {
		r.log.Warn().Msg("a group of lines went out on more than one connection: sending them again one by one")
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	n, err := r.direct.Count(cctx, r.stream, r.subject, from)
	cancel()
	if errors.Is(err, directget.ErrNoDirect) {
		r.groupMin = 0 // a stream without direct gets: no more groups
	}
	if err != nil {
		return fmt.Errorf("worker: counting a group of lines: %w", err)
	}
	if n != uint64(len(lines)) {
		r.log.Warn().Int("sent", len(lines)).Uint64("stored", n).Msg("the stream did not store every line of a group: sending them again one by one")
		return nil
	}
	r.gapFrom = 0
	r.lastSeq = max(r.lastSeq, f.a.Seq)
	return nil
}

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

func newRelay(r *relay) *relay {
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
func (r *relay) isFenced() bool {
	if r.hint != nil && r.hint() {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenced
}

// emit journals and queues one line; called from one goroutine, in order.
func (r *relay) emit(line []byte) error {
	if r.isFenced() {
		return errFenced
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
			return fmt.Errorf("worker: journal query %s seq %d: %w", r.id, seq, err)
		}
		// The journal's disk is full: the line still goes to NATS, where
		// FLEET_QUERIES keeps it and the archiver stores it in the
		// transcript. (A line too large for NATS has no such way, above.)
		r.metrics.linesNotJournaled.Inc()
		r.metrics.journalFull.Set(1)
	}
	r.seq = seq
	if len(line) > r.maxPayload {
		data = pointer(seq, len(line), storage.LineKey(r.tenant, r.id, seq))
	}
	r.metrics.linesRelayed.Inc()
	r.metrics.bytesRelayed.Add(float64(len(line)))
	r.mu.Lock()
	for r.held+len(data) > r.maxQueued && r.held > 0 && !r.closed && !r.fenced && !r.stopped {
		r.cond.Wait()
	}
	if r.fenced {
		r.mu.Unlock()
		return errFenced
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
func (r *relay) wake() {
	r.mu.Lock()
	//lint:ignore SA2001 an empty critical section orders the broadcast after any waiter's check
	r.mu.Unlock()
	r.cond.Broadcast()
}

// take waits for queued lines and returns them; nil once the relay is
// closed and empty, fenced, or ctx ended.
func (r *relay) take(ctx context.Context) []outMsg {
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

// run publishes queued lines in order until the relay is closed and every
// line is stored, it is fenced, or ctx ends.
func (r *relay) run(ctx context.Context) {
	defer close(r.done)
	defer func() {
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
		r.cond.Broadcast()
	}()
	stopWake := context.AfterFunc(ctx, r.wake)
	defer stopWake()
	var (
		pending  []outMsg // to send, in order
		inflight []flight // sent, not resolved, in order
	)
	// Acknowledgements never awaited again (the run ends) are forgotten.
	defer func() {
		for _, p := range inflight {
			r.pub.Forget(p.a)
		}
	}()
	// resolve collects finished publishes from the oldest on; with block
	// it waits for the oldest first. It returns the first error met. What
	// it collects is marked stored (and acked to the journal) once.
	resolve := func(block bool) error {
		var last uint64
		freed := 0
		defer func() {
			if last > 0 {
				r.setStoredFreed(last, freed)
			}
		}()
		for len(inflight) > 0 {
			p := inflight[0]
			if !p.a.Done() {
				if !block {
					return nil
				}
				if err := r.await(ctx, p); err != nil {
					if ctx.Err() == nil {
						inflight[0].failed = true
					}
					return err
				}
			}
			if p.a.Err != nil {
				inflight[0].failed = true
				return p.a.Err
			}
			last, freed = p.m.seq, freed+len(p.m.data)
			r.lastSeq = max(r.lastSeq, p.a.Seq)
			inflight = inflight[1:]
			block = false
		}
		return nil
	}
	// resolveAll waits until nothing is in flight.
	resolveAll := func() error {
		for len(inflight) > 0 {
			if err := resolve(true); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		if ctx.Err() != nil {
			r.setErr(fmt.Errorf("worker: relaying query %s: %w", r.id, context.Cause(ctx)))
			return
		}
		if r.isFenced() {
			r.setFenced()
			r.drop(len(pending) + len(inflight))
			return
		}
		if len(pending) == 0 {
			if len(inflight) > 0 {
				// Collect what is done; wait for the oldest only when
				// nothing new is queued.
				if err := resolve(false); err != nil {
					pending, inflight = r.recover(ctx, err, inflight, pending)
					continue
				}
				r.mu.Lock()
				idle := len(r.queue) == 0
				r.mu.Unlock()
				if idle {
					if err := resolve(true); err != nil {
						pending, inflight = r.recover(ctx, err, inflight, pending)
					}
					continue
				}
			}
			pending = r.take(ctx)
			if pending == nil {
				r.mu.Lock()
				finished := r.closed && len(r.queue) == 0
				r.mu.Unlock()
				if finished && len(inflight) == 0 {
					return
				}
				continue
			}
		}
		if r.grouping(len(pending)) {
			// A group goes out with nothing else in flight: its count
			// must find only its own lines.
			if err := resolveAll(); err != nil {
				pending, inflight = r.recover(ctx, err, inflight, pending)
				continue
			}
			n := min(len(pending), max(r.window, groupMax))
			if err := r.sendGroup(ctx, pending[:n]); err != nil {
				pending, inflight = r.recover(ctx, err, nil, pending)
				continue
			}
			if r.gapFrom == 0 { // every line of the group is stored
				freed := 0
				for _, m := range pending[:n] {
					freed += len(m.data)
				}
				r.setStoredFreed(pending[n-1].seq, freed)
				pending = pending[n:]
			}
			continue // else the lines go again, one acknowledgement each
		}
		m := pending[0]
		if !r.nc.IsConnected() {
			// Never let a line wait in the client's reconnect buffer
			// while an earlier one may be lost with the old connection.
			pending, inflight = r.recover(ctx, nats.ErrDisconnected, inflight, pending)
			continue
		}
		f, err := r.send(m)
		if err != nil {
			pending, inflight = r.recover(ctx, err, inflight, pending)
			continue
		}
		inflight = append(inflight, f)
		pending = pending[1:]
		block := len(inflight) >= r.window
		if err := resolve(block); err != nil {
			pending, inflight = r.recover(ctx, err, inflight, pending)
		}
	}
}

// recover handles a failed publish: it waits until every line in flight is
// resolved, rechecks the fence after a "wrong last sequence", reads the
// query's last line back from the stream leader, and returns what is left
// to send (in order, from the first line not stored) with nothing in
// flight. While NATS is away it keeps retrying the read (with backoff)
// until ctx ends.
func (r *relay) recover(ctx context.Context, cause error, inflight []flight, pending []outMsg) ([]outMsg, []flight) {
	r.metrics.publishErrors.Inc()
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
func (r *relay) await(ctx context.Context, p flight) error {
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
func (r *relay) lastStored(ctx context.Context) (uint64, error) {
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

// message is m as a NATS message. The relay goroutine alone calls it and
// publishes the result before the next call, so one message and its
// header map serve every line: only the values that change are set.
func (r *relay) message(m outMsg) *nats.Msg {
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

func (r *relay) drop(n int) {
	if n > 0 {
		r.log.Warn().Int("dropped", n).Msg("fenced: not publishing the rest (the journal keeps it)")
	}
}

// setStoredFreed marks every line up to seq stored and releases freed
// bytes of the bound on held lines, waking an emit waiting for room.
func (r *relay) setStoredFreed(seq uint64, freed int) {
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

func (r *relay) storedSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored
}

func (r *relay) setFenced() {
	r.mu.Lock()
	r.fenced = true
	r.mu.Unlock()
	r.cond.Broadcast()
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

// flush closes the relay and waits until every line is stored in the
// stream. It fails if that did not happen: ctx ended, the relay's context
// ended first, or the attempt was fenced (errFenced).
func (r *relay) flush(ctx context.Context) error {
	r.close()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("worker: flushing query %s: %w", r.id, ctx.Err())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.fenced:
		return errFenced
	case r.lastErr != nil:
		return r.lastErr
	case r.stored < r.seq:
		return fmt.Errorf("worker: flushing query %s: %d of %d lines stored", r.id, r.stored-r.base, r.seq-r.base)
	}
	return nil
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
