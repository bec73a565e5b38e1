package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Owner is one attempt of one submission: who writes.
type Owner struct {
	// JobSeq is the submission's FLEET_JOBS stream sequence.
	JobSeq uint64
	// Attempt is the delivery count of the job message.
	Attempt int
	// Worker names the writer (status events carry it).
	Worker string
}

// Verdict is what an attempt may do given the query's last status.
type Verdict int

const (
	// Proceed: the attempt may claim the query and write.
	Proceed Verdict = iota
	// Finished: the submission already has its terminal status. Ack the
	// job; write nothing.
	Finished
	// Superseded: a later attempt of the same submission owns the query.
	// Stop; write nothing more; leave the job message to that attempt.
	Superseded
	// Replaced: a newer submission of the same id owns the query. Stop;
	// write nothing more. No attempt of this submission may run again, so
	// its job message is terminated rather than left to be redelivered
	// (and dead-lettered after max deliveries).
	Replaced
)

func (v Verdict) String() string {
	switch v {
	case Proceed:
		return "proceed"
	case Finished:
		return "finished"
	case Superseded:
		return "superseded"
	case Replaced:
		return "replaced"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Decide says what attempt me may do when last is the query's last status
// (nil: none). A status without a JobSeq (an older writer's) counts as the
// same submission's.
func Decide(last *protocol.StatusEvent, me Owner) Verdict {
	if last == nil {
		return Proceed
	}
	switch {
	case last.JobSeq != 0 && last.JobSeq > me.JobSeq:
		return Replaced
	case last.JobSeq != 0 && last.JobSeq < me.JobSeq:
		// An earlier submission's status, terminal or not: a new
		// submission starts over (its claim fences a zombie of the old).
		return Proceed
	case last.State.Terminal():
		return Finished
	case last.Attempt > me.Attempt:
		return Superseded
	case last.Attempt == me.Attempt && last.Worker != "" && last.Worker != me.Worker:
		// The same delivery claimed by someone else: not ours.
		return Superseded
	}
	return Proceed
}

// WrongLastSequence reports whether err is the server's rejection of a
// compare-and-set: on a one-replica stream code 10071, on a replicated one
// 10164 (which also means "another checked message on that subject is
// still being proposed").
func WrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// LastMsgVia reads the last message on subject as LastMsg does; with
// oneReplica set (the stream has a single replica, so its only server is
// its leader) it uses a direct get instead: the same answer, without the
// JSON API's encoding and decoding on either side.
func LastMsgVia(ctx context.Context, nc *nats.Conn, stream, subject string, oneReplica bool) (*jetstream.RawStreamMsg, error) {
	if !oneReplica {
		return LastMsg(ctx, nc, stream, subject)
	}
	resp, err := nc.RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"DIRECT.GET."+stream+"."+subject, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return LastMsg(ctx, nc, stream, subject) // the stream does not allow direct gets
	}
	if err != nil {
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, err)
	}
	switch st := resp.Header.Get("Status"); st {
	case "":
	case "404":
		return nil, jetstream.ErrMsgNotFound
	default:
		return nil, fmt.Errorf("fence: last message on %s: status %s %s", subject, st, resp.Header.Get("Description"))
	}
	msg, err := directget.RawMsg(resp)
	if err != nil {
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, err)
	}
	return msg, nil
}

// LastMsgsVia reads the last message on each of subjects (nil where there
// is none), as LastMsgVia reads one: with oneReplica set, one multi-last
// direct get through mux answers for all of them (a stream without direct
// gets falls back to leader reads); otherwise each is read from the
// leader, all at once.
func LastMsgsVia(ctx context.Context, nc *nats.Conn, mux *directget.Mux, stream string, subjects []string, oneReplica bool) ([]*jetstream.RawStreamMsg, error) {
	if oneReplica {
		msgs, err := mux.LastMsgs(ctx, stream, subjects)
		if !errors.Is(err, directget.ErrNoDirect) {
			return msgs, err
		}
	}
	out := make([]*jetstream.RawStreamMsg, len(subjects))
	errs := make([]error, len(subjects))
	var wg sync.WaitGroup
	for i, subj := range subjects {
		wg.Go(func() {
			m, err := LastMsg(ctx, nc, stream, subj)
			if !errors.Is(err, jetstream.ErrMsgNotFound) {
				out[i], errs[i] = m, err
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// LastMsg reads the last message on subject from the stream's leader
// (STREAM.MSG.GET, not a direct get, which any replica may answer from a
// state that lags). It returns jetstream.ErrMsgNotFound when there is none.
// ctx must have a deadline.
func LastMsg(ctx context.Context, nc *nats.Conn, stream, subject string) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	resp, err := nc.RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, err)
	}
	var r struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, r.Error)
	}
	if r.Message == nil {
		return nil, fmt.Errorf("fence: last message on %s: %w", subject, jetstream.ErrInvalidJetStreamResponse)
	}
	msg := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Seq, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if msg.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("fence: last message on %s: %w", subject, err)
		}
	}
	return msg, nil
}

// LastStatus reads the last status event on subject (seq 0 and nil: none).
// A message that does not decode counts as no event at that seq.
func LastStatus(ctx context.Context, nc *nats.Conn, stream, subject string) (uint64, *protocol.StatusEvent, error) {
	return LastStatusVia(ctx, nc, stream, subject, false)
}

// LastStatusVia is LastStatus, read as LastMsgVia reads.
func LastStatusVia(ctx context.Context, nc *nats.Conn, stream, subject string, oneReplica bool) (uint64, *protocol.StatusEvent, error) {
	m, err := LastMsgVia(ctx, nc, stream, subject, oneReplica)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	seq, ev := statusOf(m)
	return seq, ev, nil
}

// statusOf is the status event m holds (seq 0 and nil for no message; nil
// for one that does not decode).
func statusOf(m *jetstream.RawStreamMsg) (uint64, *protocol.StatusEvent) {
	if m == nil {
		return 0, nil
	}
	var ev protocol.StatusEvent
	if json.Unmarshal(m.Data, &ev) != nil {
		return m.Sequence, nil
	}
	return m.Sequence, &ev
}

// Config configures a Writer.
type Config struct {
	// JS publishes; NC reads from the stream leader. Required.
	JS jetstream.JetStream
	NC *nats.Conn
	// Stream is FLEET_QUERIES; Subject the query's .status subject. Required.
	Stream, Subject string
	// OneReplica says the stream has a single replica: the last status is
	// then read with a direct get (see LastMsgVia).
	OneReplica func() bool
	// Owner is the attempt.
	Owner Owner
	// Timeout bounds each publish and read. Defaults to 5s.
	Timeout time.Duration
	// RetryMin and RetryMax bound the backoff between tries. Default 50ms and 2s.
	RetryMin, RetryMax time.Duration
	// OnRetry, if set, is told about each failed try (for logging).
	OnRetry func(op string, try int, err error)
}

// Writer publishes one attempt's statuses as compare-and-sets and holds
// the token its lines carry. Safe for concurrent use.
type Writer struct {
	cfg   Config
	token atomic.Uint64
	read  atomic.Pointer[lastRead] // set by Use, taken by the next readLast
}

// lastRead is a last status read by the caller (Use).
type lastRead struct {
	seq uint64
	ev  *protocol.StatusEvent
}

// NewWriter returns the writer of attempt cfg.Owner.
func NewWriter(cfg Config) *Writer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 50 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 2 * time.Second
	}
	return &Writer{cfg: cfg}
}

// Token is the stream sequence of the attempt's last stored status: lines
// published with Check(Token()) are stored only while it is the last.
func (w *Writer) Token() uint64 { return w.token.Load() }

// Subject is the .status subject the token refers to.
func (w *Writer) Subject() string { return w.cfg.Subject }

// Expect reads the query's last status and, if the attempt may proceed,
// takes it as the token without publishing anything: for an attempt whose
// first status comes later (its lines are fenced from the moment a later
// attempt claims, but it does not fence an older writer itself).
func (w *Writer) Expect(ctx context.Context) (Verdict, error) {
	seq, last, err := w.readLast(ctx)
	if err != nil {
		return Proceed, err
	}
	if v := Decide(last, w.cfg.Owner); v != Proceed {
		return v, nil
	}
	w.token.Store(seq)
	return Proceed, nil
}

// Claim reads the query's last status and, if the attempt may proceed,
// publishes ev (its first status) as a compare-and-set on it. It retries
// until the status is stored, another verdict is reached, or ctx ends.
func (w *Writer) Claim(ctx context.Context, ev protocol.StatusEvent) (Verdict, error) {
	seq, last, err := w.readLast(ctx)
	if err != nil {
		return Proceed, err
	}
	if v := Decide(last, w.cfg.Owner); v != Proceed {
		return v, nil
	}
	w.token.Store(seq)
	return w.Publish(ctx, ev)
}

// Publish stores ev on the status subject if the last status there is
// still the token. On a conflict it reads the last status back: its own
// (a publish whose ack was lost) counts as stored; a verdict other than
// Proceed is returned as is; anything else (a status that does not fence
// this attempt, e.g. a dispatcher's "queued") becomes the new expectation
// and the publish is tried again. Transient errors are retried with backoff
// until ctx ends. ev is sent as given (set V, Worker and At first); it is
// recognised by its owner, state and At when read back.
func (w *Writer) Publish(ctx context.Context, ev protocol.StatusEvent) (Verdict, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return Proceed, err
	}
	backoff := w.cfg.RetryMin
	for try := 1; ; try++ {
		m := nats.NewMsg(w.cfg.Subject)
		m.Data = data
		m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
		pctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
		ack, err := w.cfg.JS.PublishMsg(pctx, m, jetstream.WithExpectLastSequencePerSubject(w.token.Load()))
		cancel()
		if err == nil {
			w.token.Store(ack.Sequence)
			return Proceed, nil
		}
		if ctx.Err() != nil {
			return Proceed, fmt.Errorf("fence: publishing %s status: %w", ev.State, err)
		}
		if !WrongLastSequence(err) && w.cfg.OnRetry != nil {
			w.cfg.OnRetry("publish "+string(ev.State)+" status", try, err)
		}
		// Whatever the error, the status may or may not be stored: look.
		seq, last, rerr := w.readLast(ctx)
		if rerr != nil {
			return Proceed, rerr
		}
		if own(last, ev, w.cfg.Owner) {
			w.token.Store(seq)
			return Proceed, nil
		}
		if v := Decide(last, w.cfg.Owner); v != Proceed {
			return v, nil
		}
		if WrongLastSequence(err) && seq != w.token.Load() {
			// A status that does not fence us came in between: expect it.
			w.token.Store(seq)
			continue
		}
		if err := sleep(ctx, backoff); err != nil {
			return Proceed, fmt.Errorf("fence: publishing %s status: %w", ev.State, err)
		}
		backoff = min(2*backoff, w.cfg.RetryMax)
	}
}

// Recheck is called when a line was rejected with "wrong last sequence":
// it reads the last status again. Proceed means the attempt still owns the
// query (the token now expects the last status, which does not fence it);
// any other verdict means it was fenced.
func (w *Writer) Recheck(ctx context.Context) (Verdict, error) {
	seq, last, err := w.readLast(ctx)
	if err != nil {
		return Proceed, err
	}
	v := Decide(last, w.cfg.Owner)
	if v == Proceed && last != nil && last.JobSeq == w.cfg.Owner.JobSeq && last.Attempt == w.cfg.Owner.Attempt && last.Worker == w.cfg.Owner.Worker {
		w.token.Store(seq)
		return Proceed, nil
	}
	if v == Proceed && seq != w.token.Load() {
		// A status that is not ours and does not fence us (an older
		// writer's or a queued status): keep going after it.
		w.token.Store(seq)
	}
	return v, nil
}

// Use makes the next Claim or Expect decide on m, the query's last status
// message as the caller just read it (nil: none), instead of reading it
// again: for a caller that reads it together with other subjects
// (LastMsgsVia). Only that one read is replaced. A status stored since is
// caught as any race is: the claim's compare-and-set fails, and the status
// is read back.
func (w *Writer) Use(m *jetstream.RawStreamMsg) {
	seq, ev := statusOf(m)
	w.read.Store(&lastRead{seq: seq, ev: ev})
}

// readLast reads the last status, retrying transient failures until ctx ends.
func (w *Writer) readLast(ctx context.Context) (uint64, *protocol.StatusEvent, error) {
	if r := w.read.Swap(nil); r != nil {
		return r.seq, r.ev, nil
	}
	backoff := w.cfg.RetryMin
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
		seq, ev, err := LastStatusVia(rctx, w.cfg.NC, w.cfg.Stream, w.cfg.Subject, w.cfg.OneReplica != nil && w.cfg.OneReplica())
		cancel()
		if err == nil {
			return seq, ev, nil
		}
		if w.cfg.OnRetry != nil {
			w.cfg.OnRetry("read the last status", try, err)
		}
		if err := sleep(ctx, backoff); err != nil {
			return 0, nil, fmt.Errorf("fence: reading the last status: %w", err)
		}
		backoff = min(2*backoff, w.cfg.RetryMax)
	}
}

// own reports whether last is ev as published by owner.
func own(last *protocol.StatusEvent, ev protocol.StatusEvent, o Owner) bool {
	return last != nil && last.JobSeq == o.JobSeq && last.Attempt == o.Attempt && last.Worker == o.Worker &&
		last.State == ev.State && last.At.Equal(ev.At)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
