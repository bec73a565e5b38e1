package archiver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Consumer is the archiver's durable consumer on FLEET_QUERIES.
const Consumer = "archiver"

// Config configures a Service.
type Config struct {
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// Names builds subjects and stream names.
	Names protocol.Names
	// Store holds transcripts and chunks. Required.
	Store storage.Store
	// Delay is how long after a terminal status the query is looked at.
	// Defaults to 10s.
	Delay time.Duration
	// ReadTimeout bounds one repair (reading the query's lines and writing
	// what is missing). A repair that runs out of it, or whose read stalls
	// (a server restart in the middle of it, say), is retried later.
	// Defaults to 30s.
	ReadTimeout time.Duration
	// Workers is how many queries are repaired at once, so that one slow
	// or stalled repair never holds up the others. Defaults to 8.
	Workers int
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Service repairs transcripts of finished queries from the stream.
type Service struct {
	cfg Config
	js  jetstream.JetStream
	log zerolog.Logger

	// slots bounds the repairs in flight; work tracks them, and life ends
	// them when the service stops.
	slots chan struct{}
	work  sync.WaitGroup
	life  context.Context
	end   context.CancelFunc

	mu      sync.Mutex
	cc      jetstream.ConsumeContext
	stopped bool
	// repaired counts lines added to transcripts (for tests and metrics).
	repaired int64
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil || cfg.Store == nil {
		return nil, errors.New("archiver: NC and Store are required")
	}
	cfg.Delay = cmp.Or(cfg.Delay, 10*time.Second)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, 30*time.Second)
	cfg.Workers = cmp.Or(cfg.Workers, 8)
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	return &Service{
		cfg: cfg, js: js, log: cfg.Logger.With().Str("component", "archiver").Logger(),
		slots: make(chan struct{}, cfg.Workers), life: life, end: end,
	}, nil
}

// Start creates (or finds) the durable consumer and starts consuming. The
// streams must exist (the dispatcher provisions them first). A Start after
// a successful one, or after Stop, returns an error.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return errors.New("archiver: stopped")
	case s.cc != nil:
		return errors.New("archiver: already started")
	}
	n := s.cfg.Names
	c, err := s.js.CreateOrUpdateConsumer(ctx, n.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       Consumer,
		FilterSubject: n.StatusWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       2*s.cfg.ReadTimeout + time.Minute,
		MaxAckPending: 4096,
	})
	if err != nil {
		return fmt.Errorf("archiver: consumer: %w", err)
	}
	cc, err := c.Consume(s.handle, jetstream.PullMaxMessages(64), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		s.log.Debug().Err(err).Msg("consuming status events")
	}))
	if err != nil {
		return fmt.Errorf("archiver: consume: %w", err)
	}
	s.cc = cc
	return nil
}

// Stop stops consuming and waits for the repairs in flight, bounded by
// ctx; when ctx ends first they are cancelled (their events are
// redelivered later, to this or another dispatcher). Safe to call twice
// and before Start.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	cc := s.cc
	s.stopped = true
	s.mu.Unlock()
	if cc != nil {
		cc.Stop()
	}
	done := make(chan struct{})
	go func() {
		s.work.Wait()
		close(done)
	}()
	defer s.end()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.end()
		<-done
		return ctx.Err()
	}
}

// Repaired is how many lines the service added to transcripts so far.
func (s *Service) Repaired() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.repaired
}

func (s *Service) handle(m jetstream.Msg) {
	var ev protocol.StatusEvent
	if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
		_ = m.Term()
		return
	}
	if !ev.State.Terminal() {
		_ = m.Ack()
		return
	}
	if md, err := m.Metadata(); err == nil && md.NumDelivered == 1 {
		_ = m.NakWithDelay(s.cfg.Delay)
		return
	}
	// The repair runs beside the others (up to Workers at once); the
	// callback waits only for a free slot, which is the backpressure.
	select {
	case s.slots <- struct{}{}:
	case <-s.life.Done():
		return // redelivered after the ack wait
	}
	s.work.Add(1)
	go func() {
		defer func() { <-s.slots; s.work.Done() }()
		s.repairEvent(m, ev)
	}()
}

func (s *Service) repairEvent(m jetstream.Msg, ev protocol.StatusEvent) {
	ctx, cancel := context.WithTimeout(s.life, s.cfg.ReadTimeout)
	defer cancel()
	added, err := s.Repair(ctx, ev.Tenant, ev.ID)
	if err != nil {
		if s.life.Err() != nil {
			return // stopping: redelivered after the ack wait
		}
		delay := time.Second
		if md, merr := m.Metadata(); merr == nil {
			delay = retryDelay(md.NumDelivered)
		}
		s.log.Warn().Err(err).Str("tenant", ev.Tenant).Str("query_id", ev.ID).Dur("retry_in", delay).
			Msg("repairing the transcript failed; will retry")
		_ = m.NakWithDelay(delay)
		return
	}
	if added > 0 {
		s.mu.Lock()
		s.repaired += int64(added)
		s.mu.Unlock()
		s.log.Warn().Str("tenant", ev.Tenant).Str("query_id", ev.ID).Int("lines", added).
			Msg("transcript was missing lines that are in the stream; stored them")
	}
	_ = m.Ack()
}

// retryDelay is the wait before the next try of a repair delivered n
// times (the first delivery is only the Delay): 1s, 2s, 4s … up to 30s.
func retryDelay(n uint64) time.Duration {
	d := time.Second
	for i := uint64(2); i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Repair makes the stored transcript of tenant/id hold every line its .msg
// subject holds in the stream; it returns how many lines it added.
func (s *Service) Repair(ctx context.Context, tenant, id string) (int, error) {
	lines, err := s.streamLines(ctx, tenant, id)
	if err != nil {
		return 0, err
	}
	return storage.RepairTranscript(ctx, s.cfg.Store, tenant, id, lines)
}

// streamLines reads the query's .msg lines from the stream, up to the last
// one stored when the read starts.
func (s *Service) streamLines(ctx context.Context, tenant, id string) ([]storage.StreamLine, error) {
	n := s.cfg.Names
	subj := n.QueryMsg(tenant, id)
	rctx := ctx
	st, err := s.js.Stream(rctx, n.QueriesStream())
	if err != nil {
		return nil, err
	}
	last, err := st.GetLastMsgForSubject(rctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := jsconsumer.Ordered(rctx, s.js, n.QueriesStream(), subj)
	if err != nil {
		return nil, err
	}
	defer jsconsumer.Release(s.js, n.QueriesStream(), c)
	var out []storage.StreamLine
	for empty := 0; ; {
		// Every line up to last is in the stream already: take what the
		// server has at once (a Fetch with a wait would hold each read for
		// its whole wait when fewer than a batch of lines remain).
		batch, err := c.FetchNoWait(256)
		if err != nil {
			return nil, err
		}
		got := 0
		done := false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			if l, ok := s.line(rctx, tenant, id, m); ok {
				out = append(out, l)
			}
			if md.Sequence.Stream >= last.Sequence {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if done {
			return out, nil
		}
		if err := rctx.Err(); err != nil {
			return nil, err
		}
		// The last line is in the stream, so an empty fetch means the
		// read is stuck (its consumer went with a server restart, say):
		// give up after two and let the event be retried.
		if got == 0 {
			if empty++; empty == 2 {
				return nil, fmt.Errorf("reading %s stalled at %d lines", subj, len(out))
			}
		} else {
			empty = 0
		}
	}
}

// line turns one .msg message into its stored line; a large-line pointer
// is resolved from storage (ok is false when it cannot be).
func (s *Service) line(ctx context.Context, tenant, id string, m jetstream.Msg) (storage.StreamLine, bool) {
	seq, err := strconv.ParseUint(m.Headers().Get(protocol.HeaderSeq), 10, 64)
	if err != nil || seq == 0 {
		return storage.StreamLine{}, false
	}
	attempt, _ := strconv.Atoi(m.Headers().Get(protocol.HeaderAttempt))
	data := m.Data()
	if msg := protocol.ParseMessage(data); msg.Type == protocol.TypeLargeLine {
		whole, err := s.cfg.Store.Get(ctx, storage.LineKey(tenant, id, seq))
		if err != nil {
			return storage.StreamLine{}, false
		}
		data = whole
	}
	return storage.StreamLine{Seq: seq, Attempt: attempt, Data: append([]byte(nil), data...)}, true
}
