package archiver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/transcript"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/startstop"
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
	// Consumer is the durable consumer's name; archivers that share it
	// share the work. Defaults to Consumer ("archiver").
	Consumer string
	// Batch is the most terminal statuses archived together (one storage
	// batch). Defaults to 64.
	Batch int
	// Linger is how long a batch waits for more statuses after its first.
	// Defaults to 20ms.
	Linger time.Duration
	// Workers is how many batches are archived at once, so that one slow
	// or stuck batch (a slow bucket, a read across a server restart) never
	// holds up the others. Defaults to 8.
	Workers int
	// ReadTimeout bounds archiving one batch (reading its queries' lines
	// and writing their transcripts); a batch that runs out of it is
	// retried. Defaults to 30s.
	ReadTimeout time.Duration
	// Delay, if set, postpones archiving a terminal status by this much
	// after its first delivery (JetStream is the timer). Defaults to 0: at
	// once, since a terminal status is published only after every line of
	// its attempt is stored.
	Delay time.Duration
	// Retry is the delay before a query whose lines are not all readable
	// yet (a large line not in storage yet, a replica behind) is archived
	// again. Defaults to 2s.
	Retry time.Duration
	// MaxTries is how many deliveries of a terminal status the archiver
	// waits for missing lines before it writes the transcript with what it
	// has (and logs an error). Defaults to 30.
	MaxTries int
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Service writes the transcripts of finished queries from the stream.
type Service struct {
	startstop.Base

	cfg Config
	js  jetstream.JetStream
	rd  *transcript.Reader
	log zerolog.Logger

	// slots bounds the batches in flight; work tracks them; quit stops
	// the loop; life ends the batches when Stop runs out of time.
	slots chan struct{}
	work  sync.WaitGroup
	quit  chan struct{}
	life  context.Context
	end   context.CancelFunc

	// cc, queue and loopDone are set by Start and read by Stop, which
	// startstop serialises.
	cc       jetstream.ConsumeContext
	queue    chan jetstream.Msg
	loopDone chan struct{}

	mu sync.Mutex
	// archived counts transcripts written; merged those that took lines
	// from chunks (for tests and metrics).
	archived, merged int64
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil || cfg.Store == nil {
		return nil, errors.New("archiver: NC and Store are required")
	}
	cfg.Consumer = cmp.Or(cfg.Consumer, Consumer)
	cfg.Batch = cmp.Or(cfg.Batch, 64)
	cfg.Linger = cmp.Or(cfg.Linger, 20*time.Millisecond)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, 30*time.Second)
	cfg.Workers = cmp.Or(cfg.Workers, 8)
	cfg.Retry = cmp.Or(cfg.Retry, 2*time.Second)
	cfg.MaxTries = cmp.Or(cfg.MaxTries, 30)
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	// Long transcripts through a consumer (package transcript).
	rd := transcript.NewReader(cfg.NC, cfg.Names, cfg.Store).WithConsumer(js)
	return &Service{
		Base: startstop.Base{Name: "archiver"},
		cfg:  cfg, js: js, rd: rd,
		log:   cfg.Logger.With().Str("component", "archiver").Logger(),
		slots: make(chan struct{}, cfg.Workers), quit: make(chan struct{}), life: life, end: end,
	}, nil
}

// Start creates (or finds) the durable consumer and starts consuming. The
// streams must exist (the dispatcher provisions them first). A second
// Start, or one after Stop, is refused (pkg/startstop).
func (s *Service) Start(ctx context.Context) error { return s.Base.Start(ctx, s.start) }

// Stop stops consuming and waits for the batches in flight, bounded by
// ctx; when ctx ends first they are cancelled (their events are
// redelivered later, to this or another dispatcher), and so are events
// received but not archived yet. Safe to call twice and before Start.
func (s *Service) Stop(ctx context.Context) error { return s.Base.Stop(ctx, s.halt) }

func (s *Service) start(ctx context.Context) error {
	n := s.cfg.Names
	c, err := provision.Consumer(ctx, s.js, n.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       s.cfg.Consumer,
		FilterSubject: n.StatusWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       2*s.cfg.ReadTimeout + time.Minute,
		MaxAckPending: 4096,
	})
	if err != nil {
		return fmt.Errorf("archiver: consumer: %w", err)
	}
	s.queue = make(chan jetstream.Msg, 4*s.cfg.Batch)
	cc, err := c.Consume(func(m jetstream.Msg) {
		select {
		case s.queue <- m:
		case <-s.quit: // redelivered after the ack wait
		}
	}, jetstream.PullMaxMessages(2*s.cfg.Batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		s.log.Debug().Err(err).Msg("consuming status events")
	}))
	if err != nil {
		return fmt.Errorf("archiver: consume: %w", err)
	}
	s.cc, s.loopDone = cc, make(chan struct{})
	go s.loop()
	return nil
}

func (s *Service) halt(ctx context.Context) error {
	close(s.quit)
	s.cc.Stop()
	done := make(chan struct{})
	go func() {
		<-s.loopDone
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

// Archived is how many transcripts the service wrote so far.
func (s *Service) Archived() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.archived
}

// Merged is how many of those took lines from chunk objects (lines a
// journal stored because they never reached the stream).
func (s *Service) Merged() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.merged
}

// loop gathers status events into batches and archives each beside the
// others (up to Workers at once), until Stop.
func (s *Service) loop() {
	defer close(s.loopDone)
	for {
		var first jetstream.Msg
		select {
		case first = <-s.queue:
		case <-s.quit:
			return // what is queued is redelivered after the ack wait
		}
		batch := []jetstream.Msg{first}
		linger := time.NewTimer(s.cfg.Linger)
	gather:
		for len(batch) < s.cfg.Batch {
			select {
			case m := <-s.queue:
				batch = append(batch, m)
			case <-linger.C:
				break gather
			case <-s.quit:
				break gather
			}
		}
		linger.Stop()
		// A free slot is the backpressure: the queue fills, then the
		// consumer's callback waits.
		select {
		case s.slots <- struct{}{}:
		case <-s.quit:
			return
		}
		s.work.Add(1)
		go func() {
			defer func() { <-s.slots; s.work.Done() }()
			s.archive(batch)
		}()
	}
}

// job is one terminal status being archived.
type job struct {
	m          jetstream.Msg
	ev         protocol.StatusEvent
	transcript []byte
	err        error // reading failed: retry later
	missing    bool  // lines not readable yet: retry later (or give up)
}

// archive writes the transcripts of the batch's terminal statuses: it
// reads every query's lines from the stream, writes the transcripts in one
// storage batch, merges in chunk objects where a journal stored some, and
// acks the events (naks those to retry).
func (s *Service) archive(batch []jetstream.Msg) {
	var jobs []*job
	for _, m := range batch {
		var ev protocol.StatusEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
			_ = m.Term()
			continue
		}
		if !ev.State.Terminal() {
			_ = m.Ack()
			continue
		}
		if s.cfg.Delay > 0 {
			if md, err := m.Metadata(); err == nil && md.NumDelivered == 1 {
				_ = m.NakWithDelay(s.cfg.Delay)
				continue
			}
		}
		jobs = append(jobs, &job{m: m, ev: ev})
	}
	if len(jobs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.life, s.cfg.ReadTimeout)
	defer cancel()
	each(jobs, func(j *job) {
		lines, complete, err := s.rd.Lines(ctx, j.ev.Tenant, j.ev.ID)
		switch {
		case err != nil:
			j.err = err
			return
		case j.ev.Result != nil && maxSeq(lines) < j.ev.Result.LastSeq:
			// A replica behind the status (direct gets may be served by
			// one): the lines are coming.
			complete = false
		}
		if !complete && !s.lastTry(j.m) {
			j.missing = true
			return
		}
		if !complete {
			s.log.Error().Str("tenant", j.ev.Tenant).Str("query_id", j.ev.ID).
				Msg("some lines of the query could not be read (a large line missing from storage); writing the transcript without them")
		}
		j.transcript = storage.StreamTranscript(lines)
	})
	var objs []storage.Object
	var ready []*job
	for _, j := range jobs {
		if j.err == nil && !j.missing {
			objs = append(objs, storage.Object{Key: storage.TranscriptKey(j.ev.Tenant, j.ev.ID), Value: j.transcript})
			ready = append(ready, j)
		}
	}
	if err := storage.PutBatch(ctx, s.cfg.Store, objs); err != nil {
		for _, j := range ready {
			j.err = err
		}
		ready = nil
	}
	// Chunk objects exist only where a journal spilled lines that never
	// reached the stream: merge them in.
	each(ready, func(j *job) {
		merged, err := s.mergeChunks(ctx, j.ev.Tenant, j.ev.ID)
		if err != nil {
			j.err = err
		} else if merged {
			s.mu.Lock()
			s.merged++
			s.mu.Unlock()
		}
	})
	for _, j := range jobs {
		switch {
		case j.err != nil && s.life.Err() != nil:
			// Stopping: redelivered after the ack wait.
		case j.err != nil:
			delay := s.retryDelay(j.m)
			s.log.Warn().Err(j.err).Str("tenant", j.ev.Tenant).Str("query_id", j.ev.ID).Dur("retry_in", delay).
				Msg("archiving the transcript failed; will retry")
			_ = j.m.NakWithDelay(delay)
		case j.missing:
			_ = j.m.NakWithDelay(s.cfg.Retry)
		default:
			s.mu.Lock()
			s.archived++
			s.mu.Unlock()
			_ = j.m.Ack()
		}
	}
}

// retryDelay is the wait before archiving m again after a failure:
// Config.Retry, doubled with every delivery, at most 30s.
func (s *Service) retryDelay(m jetstream.Msg) time.Duration {
	d := s.cfg.Retry
	if md, err := m.Metadata(); err == nil {
		for i := uint64(1); i < md.NumDelivered && d < 30*time.Second; i++ {
			d *= 2
		}
	}
	return min(d, 30*time.Second)
}

// lastTry reports whether m has been delivered MaxTries times.
func (s *Service) lastTry(m jetstream.Msg) bool {
	md, err := m.Metadata()
	return err == nil && md.NumDelivered >= uint64(s.cfg.MaxTries)
}

// mergeChunks merges the query's chunk objects, if any, into the
// transcript just written from the stream. It repeats while new chunks
// arrive during a merge, so the last transcript written has seen every
// chunk stored before it; a journal that stores chunks later merges them
// itself (transcript.Reader.Merge).
func (s *Service) mergeChunks(ctx context.Context, tenant, id string) (bool, error) {
	keys, err := storage.ChunkKeys(ctx, s.cfg.Store, tenant, id)
	if err != nil || len(keys) == 0 {
		return false, err
	}
	return true, s.rd.Merge(ctx, tenant, id)
}

// each runs fn for every job, eight at a time.
func each(jobs []*job, fn func(*job)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(j)
		})
	}
	wg.Wait()
}

func maxSeq(lines []storage.StreamLine) uint64 {
	var m uint64
	for _, l := range lines {
		m = max(m, l.Seq)
	}
	return m
}
