package directget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoDirect: the stream answers no direct gets (it does not allow them,
// or does not exist): read through the JSON API instead.
var ErrNoDirect = errors.New("directget: the stream answers no direct gets")

// Mux routes the replies of one connection's multi-message direct gets.
// The zero value is not usable: see New. Safe for concurrent use.
type Mux struct {
	nc     *nats.Conn
	once   sync.Once
	err    error
	prefix string // "<inbox>."
	next   atomic.Uint64
	mu     sync.Mutex
	waits  map[string]chan *nats.Msg
}

// New returns a Mux on nc. Its subscription is made on first use and lives
// as long as nc.
func New(nc *nats.Conn) *Mux { return &Mux{nc: nc} }

// Subscribe makes the reply subscription now rather than on first use (a
// worker has all its subscriptions before it runs a job). Later calls
// return the first call's error.
func (x *Mux) Subscribe() error {
	x.once.Do(func() {
		x.prefix = x.nc.NewInbox() + "."
		x.waits = map[string]chan *nats.Msg{}
		_, x.err = x.nc.Subscribe(x.prefix+"*", func(m *nats.Msg) {
			x.mu.Lock()
			c := x.waits[m.Subject]
			if c != nil {
				select {
				case c <- m:
				default: // more than asked for: not a reply to a live request
				}
			}
			x.mu.Unlock()
		})
	})
	return x.err
}

// open registers a reply subject whose messages go to a channel with room
// for n of them (the most a get asks for, with its end marker: replies
// beyond that are not the get's and are dropped). done unregisters it.
func (x *Mux) open(n int) (subject string, replies <-chan *nats.Msg, done func(), err error) {
	if err := x.Subscribe(); err != nil {
		return "", nil, nil, err
	}
	subject = x.prefix + strconv.FormatUint(x.next.Add(1), 36)
	ch := make(chan *nats.Msg, n)
	x.mu.Lock()
	x.waits[subject] = ch
	x.mu.Unlock()
	return subject, ch, func() {
		x.mu.Lock()
		delete(x.waits, subject)
		x.mu.Unlock()
	}, nil
}

// LastMsgs reads the last message on each of subjects (literal subjects,
// at most a few hundred) from stream with one multi-last direct get. The
// result has one entry per subject, in order, nil where the subject has
// no message. ctx bounds the wait; it must have a deadline or be
// cancelled, as a get whose answer is lost is never answered.
func (x *Mux) LastMsgs(ctx context.Context, stream string, subjects []string) ([]*jetstream.RawStreamMsg, error) {
	out := make([]*jetstream.RawStreamMsg, len(subjects))
	if len(subjects) == 0 {
		return out, nil
	}
	at := make(map[string]int, len(subjects))
	for i, s := range subjects {
		at[s] = i
	}
	req := struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{subjects, len(subjects)}
	_, err := x.get(ctx, stream, req, len(subjects), func(msg *nats.Msg) (bool, error) {
		m, err := RawMsg(msg)
		if err != nil {
			return false, err
		}
		i, ok := at[m.Subject]
		if !ok {
			return false, fmt.Errorf("a message on %q, which was not asked for", m.Subject)
		}
		out[i] = m
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("directget: last messages of %s: %w", stream, err)
	}
	return out, nil
}

// get sends one direct get req to stream whose answer is up to n messages
// and an end marker, and hands each message (as received: RawMsg reads
// it) to add until add says no more or errs. It returns the end marker of a batch (its headers say how many
// more match), nil when the answer was "none" or add stopped first.
// ErrNoDirect: nothing answers direct gets of stream.
func (x *Mux) get(ctx context.Context, stream string, req any, n int, add func(*nats.Msg) (more bool, err error)) (end *nats.Msg, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err // ended already: ask nothing (a reply could otherwise win the wait below)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inbox, replies, done, err := x.open(n + 1)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := x.nc.PublishRequest(jetstream.DefaultAPIPrefix+"DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, err
	}
	for {
		var m *nats.Msg
		select {
		case m = <-replies:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "404": // nothing
			return nil, nil
		case "204": // the end of the batch
			return m, nil
		case "503":
			return nil, ErrNoDirect
		default:
			return nil, fmt.Errorf("status %s %s", st, m.Header.Get("Description"))
		}
		if more, err := add(m); err != nil || !more {
			return nil, err
		}
	}
}

// RawMsg is a direct get's reply (one that carries a message, not a
// status) as the stored message. The server adds its headers (sequence,
// subject, time) after the stored message's own, so where a publisher
// stored a header of the same name (a copy of a message read back), the
// server's is the last value, and that one is used.
func RawMsg(m *nats.Msg) (*jetstream.RawStreamMsg, error) {
	seq, err := strconv.ParseUint(lastValue(m.Header, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad %s: %w", jetstream.SequenceHeader, err)
	}
	rm := &jetstream.RawStreamMsg{Subject: lastValue(m.Header, jetstream.SubjectHeader), Sequence: seq, Data: m.Data, Header: m.Header}
	if ts := lastValue(m.Header, jetstream.TimeStampHeaer); ts != "" {
		if rm.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
			return nil, fmt.Errorf("bad %s: %w", jetstream.TimeStampHeaer, err)
		}
	}
	return rm, nil
}

// lastValue is the last value of key in h ("" if none).
func lastValue(h nats.Header, key string) string {
	if vs := h.Values(key); len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return ""
}

// Count returns how many messages stream holds on subject (a literal
// subject) at or after sequence from, with one batched direct get: the
// first such message, and the end marker's Nats-Num-Pending (how many
// follow it). A message stored while the get runs may or may not be
// counted. ctx bounds the wait, as for LastMsgs.
func (x *Mux) Count(ctx context.Context, stream, subject string, from uint64) (uint64, error) {
	req := struct {
		Seq      uint64 `json:"seq"`
		NextFor  string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes"`
	}{max(from, 1), subject, 1, 1}
	var n uint64
	end, err := x.get(ctx, stream, req, 1, func(*nats.Msg) (bool, error) {
		n = 1 // the first message at or after from
		return true, nil
	})
	if err != nil || end == nil {
		return 0, err // none, or an error
	}
	pending, err := strconv.ParseUint(end.Header.Get("Nats-Num-Pending"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("directget: count of %s in %s: bad Nats-Num-Pending: %w", subject, stream, err)
	}
	return n + pending, nil
}

// Page reads up to batch messages on subject (a literal subject) at or
// after sequence from with one batched direct get (at most maxBytes of
// them; 0: the server's limit) and hands each to fn, as received, with its
// stream sequence: nothing else of it is parsed, for readers of whole
// transcripts. more says the subject holds messages after the last one
// handed (at sequence last). fn's error stops it and is returned. ctx
// bounds the wait, as for LastMsgs.
func (x *Mux) Page(ctx context.Context, stream, subject string, from uint64, batch, maxBytes int, fn func(m *nats.Msg, seq uint64) error) (more bool, last uint64, err error) {
	req := struct {
		Seq      uint64 `json:"seq,omitempty"`
		NextFor  string `json:"next_by_subj"`
		Batch    int    `json:"batch"`
		MaxBytes int    `json:"max_bytes,omitempty"`
	}{from, subject, batch, maxBytes}
	got, next := 0, from
	end, err := x.get(ctx, stream, req, batch, func(m *nats.Msg) (bool, error) {
		seq, err := strconv.ParseUint(lastValue(m.Header, jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return false, fmt.Errorf("bad %s: %w", jetstream.SequenceHeader, err)
		}
		if subj := lastValue(m.Header, jetstream.SubjectHeader); subj != subject || seq < next {
			return false, fmt.Errorf("a message on %q at %d, asked for %q from %d", subj, seq, subject, next)
		}
		got, last, next = got+1, seq, seq+1
		return true, fn(m, seq)
	})
	if err != nil {
		return false, 0, fmt.Errorf("directget: messages on %s in %s: %w", subject, stream, err)
	}
	if end == nil || got == 0 {
		return false, last, nil // none (left)
	}
	pending, err := strconv.ParseUint(end.Header.Get("Nats-Num-Pending"), 10, 64)
	if err != nil {
		return false, 0, fmt.Errorf("directget: messages on %s in %s: bad Nats-Num-Pending: %w", subject, stream, err)
	}
	return pending > 0, last, nil
}

// Each hands every message stream holds on subject (a literal subject) at
// or after sequence from to fn, in stream order, a Page of up to 256
// messages (at most 4 MiB, so large messages come a few at a time) after
// another. A message stored while it runs may or may not be handed over.
// fn's error stops it and is returned. ctx bounds the whole read, as for
// LastMsgs.
func (x *Mux) Each(ctx context.Context, stream, subject string, from uint64, fn func(*jetstream.RawStreamMsg) error) error {
	const batch, maxBytes = 256, 4 << 20
	from = max(from, 1)
	for {
		more, last, err := x.Page(ctx, stream, subject, from, batch, maxBytes, func(m *nats.Msg, _ uint64) error {
			rm, err := RawMsg(m)
			if err != nil {
				return err
			}
			return fn(rm)
		})
		if err != nil || !more {
			return err
		}
		from = last + 1
	}
}
