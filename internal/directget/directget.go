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

// Open registers a reply subject whose messages go to a channel with room
// for n of them (the most a get asks for, with its end marker: replies
// beyond that are not the get's and are dropped). done unregisters it.
func (x *Mux) Open(n int) (subject string, replies <-chan *nats.Msg, done func(), err error) {
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
	if x.err != nil {
		return "", nil, nil, x.err
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
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{subjects, len(subjects)})
	if err != nil {
		return nil, err
	}
	inbox, replies, done, err := x.Open(len(subjects) + 1)
	if err != nil {
		return nil, fmt.Errorf("directget: last messages of %s: %w", stream, err)
	}
	defer done()
	if err := x.nc.PublishRequest(jetstream.DefaultAPIPrefix+"DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, fmt.Errorf("directget: last messages of %s: %w", stream, err)
	}
	at := make(map[string]int, len(subjects))
	for i, s := range subjects {
		at[s] = i
	}
	for {
		var m *nats.Msg
		select {
		case m = <-replies:
		case <-ctx.Done():
			return nil, fmt.Errorf("directget: last messages of %s: %w", stream, ctx.Err())
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "404": // none of the subjects has a message
			return out, nil
		case "204": // end of the batch
			return out, nil
		case "503":
			return nil, ErrNoDirect
		default:
			return nil, fmt.Errorf("directget: last messages of %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
		rm, err := RawMsg(m)
		if err != nil {
			return nil, fmt.Errorf("directget: last messages of %s: %w", stream, err)
		}
		i, ok := at[rm.Subject]
		if !ok {
			return nil, fmt.Errorf("directget: last messages of %s: a message on %q, which was not asked for", stream, rm.Subject)
		}
		out[i] = rm
	}
}

// RawMsg is a direct get's reply (one that carries a message, not a
// status) as the stored message.
func RawMsg(m *nats.Msg) (*jetstream.RawStreamMsg, error) {
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad %s: %w", jetstream.SequenceHeader, err)
	}
	rm := &jetstream.RawStreamMsg{Subject: m.Header.Get(jetstream.SubjectHeader), Sequence: seq, Data: m.Data, Header: m.Header}
	if ts := m.Header.Get(jetstream.TimeStampHeaer); ts != "" {
		if rm.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
			return nil, fmt.Errorf("bad %s: %w", jetstream.TimeStampHeaer, err)
		}
	}
	return rm, nil
}
