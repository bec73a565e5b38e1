package pull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Puller is one worker's client of the pull protocol: one inbox
// subscription, pull requests for n jobs, and the count of jobs asked for
// and not yet delivered (package doc). Not safe for concurrent use: one
// loop owns it.
type Puller struct {
	nc      *nats.Conn
	next    string // the pull request subject
	inbox   string
	sub     *nats.Subscription
	msgs    chan *nats.Msg
	expiry  time.Duration
	hb      time.Duration
	pending int       // jobs asked for and not yet delivered, expired or lost
	seen    time.Time // last message of any kind on the inbox
}

// ErrConsumerGone ends a pull loop: the consumer must be looked up again.
var ErrConsumerGone = errors.New("pull: the consumer is gone")

// New subscribes to a new inbox for the jobs of consumer on stream; bufSize
// bounds the messages waiting to be read (say twice the slots, plus room
// for heartbeats). expiry is each request's lifetime, hb the server's idle
// heartbeat on it.
func New(nc *nats.Conn, stream, consumer string, bufSize int, expiry, hb time.Duration) (*Puller, error) {
	p := &Puller{
		nc:     nc,
		next:   jetstream.DefaultAPIPrefix + "CONSUMER.MSG.NEXT." + stream + "." + consumer,
		inbox:  nc.NewInbox(),
		msgs:   make(chan *nats.Msg, bufSize),
		expiry: expiry,
		hb:     hb,
	}
	sub, err := nc.ChanSubscribe(p.inbox, p.msgs)
	if err != nil {
		return nil, err
	}
	p.sub = sub
	return p, nil
}

// Close unsubscribes; the server drops the requests still waiting.
func (p *Puller) Close() { _ = p.sub.Unsubscribe() }

// Ask sends one pull request for n jobs.
func (p *Puller) Ask(n int) error {
	req, err := json.Marshal(struct {
		Expires   time.Duration `json:"expires"`
		Batch     int           `json:"batch"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}{p.expiry, n, p.hb})
	if err != nil {
		return err
	}
	if err := p.nc.PublishRequest(p.next, p.inbox, req); err != nil {
		return err
	}
	p.pending += n
	p.seen = time.Now()
	return nil
}

// Lost reports whether the outstanding requests went unanswered for two
// idle heartbeats (a consumer leader change, a reconnect): they are
// forgotten and asked for again.
func (p *Puller) Lost(now time.Time) bool {
	if p.pending > 0 && now.Sub(p.seen) > 2*p.hb {
		p.pending = 0
		return true
	}
	return false
}

// Msgs delivers what arrives on the inbox: jobs and status messages.
func (p *Puller) Msgs() <-chan *nats.Msg { return p.msgs }

// Pending is how many jobs were asked for and not yet delivered.
func (p *Puller) Pending() int { return p.pending }

// Heartbeat is the idle heartbeat asked of the server.
func (p *Puller) Heartbeat() time.Duration { return p.hb }

// Job takes a delivered job (not a status message) into account and
// returns it as a jetstream.Msg, acked on its reply subject.
func (p *Puller) Job(m *nats.Msg) jetstream.Msg {
	p.seen = time.Now()
	p.pending = max(0, p.pending-1)
	return &jobMsg{m: m, nc: p.nc}
}

// Status handles a status message (IsStatus). It returns ErrConsumerGone
// when the consumer was deleted.
func (p *Puller) Status(m *nats.Msg) error {
	p.seen = time.Now()
	code := m.Header.Get("Status")
	desc := strings.ToLower(m.Header.Get("Description"))
	switch code {
	case "100": // idle heartbeat
		return nil
	case "408", "409":
		if left, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); err == nil {
			p.pending = max(0, p.pending-left)
		} else if code == "409" {
			// A request ended without saying how much of it was left
			// (leadership change, max waiting): ask again for all.
			p.pending = 0
		}
		if code == "409" && strings.Contains(desc, "consumer deleted") {
			return ErrConsumerGone
		}
		return nil
	}
	return fmt.Errorf("pull: status %s %s", code, m.Header.Get("Description"))
}

// IsStatus reports whether m is a status message of the pull protocol.
func IsStatus(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") != ""
}

// jobMsg is a job delivered on the puller's inbox, acked on its reply
// subject as nats.go's jetstream.Msg would be.
type jobMsg struct {
	m    *nats.Msg
	nc   *nats.Conn
	ackd atomic.Bool
	// md is the metadata parsed from the reply subject, once: a run asks
	// for it several times (sequences, delivery count, timestamp).
	mdOnce sync.Once
	md     jetstream.MsgMetadata
	mdErr  error
}

var _ jetstream.Msg = (*jobMsg)(nil)

func (j *jobMsg) Metadata() (*jetstream.MsgMetadata, error) {
	j.mdOnce.Do(func() {
		md, err := j.m.Metadata()
		if err != nil {
			j.mdErr = err
			return
		}
		j.md = jetstream.MsgMetadata{
			NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
			Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
		}
		j.md.Sequence.Stream, j.md.Sequence.Consumer = md.Sequence.Stream, md.Sequence.Consumer
	})
	if j.mdErr != nil {
		return nil, j.mdErr
	}
	out := j.md // a copy: callers may keep or change theirs
	return &out, nil
}

func (j *jobMsg) Data() []byte         { return j.m.Data }
func (j *jobMsg) Headers() nats.Header { return j.m.Header }
func (j *jobMsg) Subject() string      { return j.m.Subject }
func (j *jobMsg) Reply() string        { return j.m.Reply }

// publish sends an ack of kind body without waiting; final acks (all but
// +WPI) mark the message as settled.
func (j *jobMsg) publish(body []byte, final bool) error {
	if err := j.check(); err != nil {
		return err
	}
	if err := j.nc.Publish(j.m.Reply, body); err != nil {
		return err
	}
	if final {
		j.ackd.Store(true)
	}
	return nil
}

func (j *jobMsg) check() error {
	if j.m.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	if j.ackd.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	return nil
}

func (j *jobMsg) Ack() error { return j.publish([]byte("+ACK"), true) }

// DoubleAck acks and waits for the server's confirmation (5s unless ctx
// has a deadline).
func (j *jobMsg) DoubleAck(ctx context.Context) error {
	if err := j.check(); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if _, err := j.nc.RequestWithContext(ctx, j.m.Reply, []byte("+ACK")); err != nil {
		return err
	}
	j.ackd.Store(true)
	return nil
}
func (j *jobMsg) Nak() error { return j.publish([]byte("-NAK"), true) }
func (j *jobMsg) NakWithDelay(d time.Duration) error {
	if d <= 0 {
		return j.Nak()
	}
	return j.publish(fmt.Appendf(nil, `-NAK {"delay": %d}`, d.Nanoseconds()), true)
}
func (j *jobMsg) InProgress() error { return j.publish([]byte("+WPI"), false) }
func (j *jobMsg) Term() error       { return j.publish([]byte("+TERM"), true) }
func (j *jobMsg) TermWithReason(reason string) error {
	return j.publish([]byte("+TERM "+reason), true)
}
