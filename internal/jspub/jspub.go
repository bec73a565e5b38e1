package jspub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher sends messages with a reply subject of its own inbox and
// resolves their Acks as the acknowledgements arrive. Safe for concurrent
// use.
type Publisher struct {
	nc     *nats.Conn
	prefix string // <inbox>.

	once   sync.Once
	subErr error
	sub    *nats.Subscription

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*Ack
	closed  bool
}

// New returns a Publisher on nc. Its reply subscription is made on the
// first Publish.
func New(nc *nats.Conn) *Publisher {
	return &Publisher{nc: nc, prefix: nc.NewInbox() + ".", pending: map[uint64]*Ack{}}
}

// Ack is one publish's acknowledgement. Done reports whether it arrived;
// Seq and Err may be read once Done is true.
type Ack struct {
	token  uint64
	notify chan<- struct{}
	done   atomic.Bool
	// Seq is the stream sequence the message was stored at (or, for a
	// duplicate, the sequence of the earlier copy).
	Seq uint64
	// Err is the stream's refusal, nil when stored.
	Err error
}

// Done reports whether the acknowledgement arrived.
func (a *Ack) Done() bool { return a.done.Load() }

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("jspub: publisher closed")

// Publish sends m with a reply subject of the Publisher's (m.Reply is
// overwritten) and returns its Ack. When the acknowledgement arrives,
// notify (if not nil) gets a value if it has room: callers waiting on
// several Acks share one channel with a buffer of one and check Done.
func (p *Publisher) Publish(m *nats.Msg, notify chan<- struct{}) (*Ack, error) {
	p.once.Do(func() {
		p.sub, p.subErr = p.nc.Subscribe(p.prefix+"*", p.handle)
		if p.subErr == nil {
			// A dropped acknowledgement only costs its publisher a
			// timeout, but none should be dropped under load.
			p.subErr = p.sub.SetPendingLimits(-1, -1)
		}
	})
	if p.subErr != nil {
		return nil, fmt.Errorf("jspub: reply subscription: %w", p.subErr)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.next++
	a := &Ack{token: p.next, notify: notify}
	p.pending[a.token] = a
	p.mu.Unlock()
	m.Reply = p.prefix + strconv.FormatUint(a.token, 10)
	if err := p.nc.PublishMsg(m); err != nil {
		p.Forget(a)
		return nil, err
	}
	return a, nil
}

// Forget drops a's entry: its acknowledgement, if it still comes, is
// ignored. Callers forget the Acks they stop waiting for (a timeout).
func (p *Publisher) Forget(a *Ack) {
	p.mu.Lock()
	delete(p.pending, a.token)
	p.mu.Unlock()
}

// InFlight is how many Acks are neither resolved nor forgotten.
func (p *Publisher) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// Close removes the reply subscription; later Publishes fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if p.sub != nil {
		return p.sub.Unsubscribe()
	}
	return nil
}

func (p *Publisher) handle(m *nats.Msg) {
	token, err := strconv.ParseUint(m.Subject[len(p.prefix):], 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	a := p.pending[token]
	delete(p.pending, token)
	p.mu.Unlock()
	if a == nil {
		return // forgotten
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		a.Err = jetstream.ErrNoStreamResponse
	} else {
		a.Seq, a.Err = ParseAck(m.Data)
	}
	a.done.Store(true)
	if a.notify != nil {
		select {
		case a.notify <- struct{}{}:
		default:
		}
	}
}

// ErrInvalidAck is returned for a reply that is not a PubAck.
var ErrInvalidAck = errors.New("jspub: invalid acknowledgement")

// ParseAck reads a PubAck. The server writes a stored message's as
// {"stream":"S","seq":N}: that exact shape (a name without quotes or
// escapes, a plain number, nothing after it) is read by hand. Anything
// else (an error, a duplicate's, a domain) is decoded with encoding/json:
// an "error" gives a *jetstream.APIError, a reply without a stream
// ErrInvalidAck.
func ParseAck(b []byte) (uint64, error) {
	const head, key = `{"stream":"`, `","seq":`
	rest, ok := bytes.CutPrefix(b, []byte(head))
	if !ok {
		return decodeAck(b)
	}
	i := bytes.Index(rest, []byte(key))
	if i < 1 || bytes.ContainsAny(rest[:i], `"\`) {
		return decodeAck(b)
	}
	digits, ok := bytes.CutSuffix(rest[i+len(key):], []byte("}"))
	if !ok || len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return decodeAck(b)
	}
	seq, err := strconv.ParseUint(string(digits), 10, 64) // digits only
	if err != nil {
		return decodeAck(b)
	}
	return seq, nil
}

// pubAck is the JSON shape of a PubAck reply.
type pubAck struct {
	Stream string              `json:"stream"`
	Seq    uint64              `json:"seq"`
	Error  *jetstream.APIError `json:"error"`
}

func decodeAck(b []byte) (uint64, error) {
	var pa pubAck
	if err := json.Unmarshal(b, &pa); err != nil {
		return 0, ErrInvalidAck
	}
	if pa.Error != nil {
		return 0, pa.Error
	}
	if pa.Stream == "" {
		return 0, ErrInvalidAck
	}
	return pa.Seq, nil
}
