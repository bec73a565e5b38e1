// Package dispatcher is the fleet's control service: it provisions the
// streams and the work consumer (idempotently, so start order with workers
// does not matter), answers <prefix>.api.{submit,cancel,status,list}, keeps
// the status index in storage from the status events in FLEET_QUERIES (so
// status and ls work after restarts), and turns max-delivery advisories into
// dead letters: the job is copied to <prefix>.dlq.<tenant>, its query ends
// with a synthetic result and a failed status, and it is removed from the
// work queue.
//
// Several dispatchers may run at once: API requests are served by a queue
// group, and the index and dead-letter consumers are durable and shared.
package dispatcher

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
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Durable consumer names of the dispatcher.
const (
	StatusConsumer = "dispatcher-status"
	DLQConsumer    = "dispatcher-dlq"
	queueGroup     = "fleet-dispatcher"
)

// Config configures the Service.
type Config struct {
	// NC is the NATS connection. Required.
	NC *nats.Conn
	// Provision configures streams and the consumer; its Names are the
	// service's names.
	Provision provision.Config
	// Status stores status records (the index). Required.
	Status storage.Store
	// Objects stores transcripts (dead letters add their synthetic result).
	// Required.
	Objects storage.Store
	// Logger; nil is Nop.
	Logger *zerolog.Logger
}

// Service is the dispatcher service.
type Service struct {
	cfg   Config
	names protocol.Names
	js    jetstream.JetStream
	log   zerolog.Logger

	mu       sync.Mutex
	subs     []*nats.Subscription
	consumes []jetstream.ConsumeContext
	ready    bool
	stopped  bool

	indexQ    chan jetstream.Msg
	indexDone chan struct{}
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.NC == nil || cfg.Status == nil || cfg.Objects == nil {
		return nil, errors.New("dispatcher: NC, Status and Objects are required")
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	js, err := jetstream.New(cfg.NC)
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg: cfg, names: cfg.Provision.Names, js: js,
		log: cfg.Logger.With().Str("component", "dispatcher").Logger(),
	}, nil
}

// Ready reports whether the service has provisioned and serves.
func (s *Service) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready && !s.stopped && s.cfg.NC.IsConnected()
}

// Start provisions the streams and starts serving. It returns once serving.
func (s *Service) Start(ctx context.Context) error {
	if err := provision.Streams(ctx, s.js, s.cfg.Provision); err != nil {
		return err
	}
	n := s.names
	handlers := map[string]nats.MsgHandler{
		n.APISubmit(): s.handleSubmit,
		n.APICancel(): s.handleCancel,
		n.APIStatus(): s.handleStatus,
		n.APIList():   s.handleList,
	}
	for subj, h := range handlers {
		sub, err := s.cfg.NC.QueueSubscribe(subj, queueGroup, h)
		if err != nil {
			return fmt.Errorf("dispatcher: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	idx, err := s.js.CreateOrUpdateConsumer(ctx, n.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       StatusConsumer,
		FilterSubject: n.StatusWildcard(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1024,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: status index consumer: %w", err)
	}
	// The index handler only queues; one goroutine drains the queue in
	// batches and writes each query's newest event once per batch, so a
	// busy fleet costs one storage write per query per batch, not one per
	// event.
	s.indexQ = make(chan jetstream.Msg, 1024)
	s.indexDone = make(chan struct{})
	cc, err := idx.Consume(func(m jetstream.Msg) { s.indexQ <- m }, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("dispatcher: status index: %w", err)
	}
	s.consumes = append(s.consumes, cc)
	go s.indexLoop(cc)
	dlq, err := s.js.CreateOrUpdateConsumer(ctx, n.AdvisoryStream(), jetstream.ConsumerConfig{
		Durable:       DLQConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       time.Minute,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: dead-letter consumer: %w", err)
	}
	cc, err = dlq.Consume(s.deadLetter, jetstream.PullMaxMessages(16))
	if err != nil {
		return fmt.Errorf("dispatcher: dead letters: %w", err)
	}
	s.consumes = append(s.consumes, cc)
	s.mu.Lock()
	s.ready = true
	s.mu.Unlock()
	s.log.Info().Str("jobs", n.JobsStream()).Str("queries", n.QueriesStream()).Msg("dispatcher serving")
	return nil
}

// Stop stops serving; in-flight handlers finish. Safe to call twice.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	subs, consumes := s.subs, s.consumes
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Drain()
	}
	for _, cc := range consumes {
		cc.Drain()
	}
	for _, cc := range consumes {
		select {
		case <-cc.Closed():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func reply(m *nats.Msg, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"error":{"code":"internal","message":"encoding the reply"}}`)
	}
	_ = m.Respond(b)
}

func apiError(code, msg string) *protocol.ErrorInfo {
	return &protocol.ErrorInfo{Code: code, Message: msg}
}

// NewID returns a fresh query id.
func NewID() string { return "q" + nuid.Next() }

func (s *Service) handleSubmit(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job, err := protocol.DecodeJob(m.Header.Get(protocol.HeaderContentType), m.Data)
	if err == nil {
		if job.ID == "" {
			job.ID = NewID()
		}
		err = job.Validate("", false)
	}
	if err != nil {
		reply(m, protocol.SubmitReply{Error: apiError(protocol.CodeInvalidJob, err.Error())})
		return
	}
	body, err := json.Marshal(job)
	if err != nil {
		reply(m, protocol.SubmitReply{Error: apiError(protocol.CodeInternal, err.Error())})
		return
	}
	n := s.names
	jm := nats.NewMsg(n.JobSubject(job.Tenant))
	jm.Data = body
	jm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	jm.Header.Set(protocol.HeaderMsgID, protocol.JobMsgID(job.Tenant, job.ID))
	ack, err := s.js.PublishMsg(ctx, jm)
	if err != nil {
		reply(m, protocol.SubmitReply{Error: apiError(protocol.CodeInternal, "publishing the job: "+err.Error())})
		return
	}
	if !ack.Duplicate {
		// After the job, so it carries the submission's JobSeq (a worker's
		// "running" may rarely be stored first; status records order events
		// by JobSeq and attempt, not by arrival).
		ev := protocol.StatusEvent{V: protocol.SchemaVersion, ID: job.ID, Tenant: job.Tenant, State: protocol.StateQueued,
			JobSeq: ack.Sequence, At: time.Now().UTC(), Metadata: job.Metadata}
		if err := s.publishJSON(ctx, n.QueryStatus(job.Tenant, job.ID), ev, ""); err != nil {
			s.log.Warn().Err(err).Str("query_id", job.ID).Msg("publishing the queued status")
		}
	}
	s.log.Info().Str("tenant", job.Tenant).Str("query_id", job.ID).Bool("duplicate", ack.Duplicate).Msg("job submitted")
	reply(m, protocol.SubmitReply{ID: job.ID, Tenant: job.Tenant, Duplicate: ack.Duplicate, Subjects: &protocol.QuerySubjects{
		Msg: n.QueryMsg(job.Tenant, job.ID), Status: n.QueryStatus(job.Tenant, job.ID), Ctl: n.QueryCtl(job.Tenant, job.ID),
	}})
}

func (s *Service) publishJSON(ctx context.Context, subject string, v any, msgID string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	pm := nats.NewMsg(subject)
	pm.Data = b
	pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	if msgID != "" {
		pm.Header.Set(protocol.HeaderMsgID, msgID)
	}
	_, err = s.js.PublishMsg(ctx, pm)
	return err
}

func decodeRef(data []byte) (protocol.QueryRef, *protocol.ErrorInfo) {
	var ref protocol.QueryRef
	if err := json.Unmarshal(data, &ref); err != nil {
		return ref, apiError(protocol.CodeInvalidJob, "request must be JSON {\"id\",\"tenant\"}: "+err.Error())
	}
	ref.Tenant = cmp.Or(ref.Tenant, protocol.DefaultTenant)
	if !protocol.ValidID(ref.ID) {
		return ref, apiError(protocol.CodeInvalidJob, "id: must match "+protocol.IDPattern)
	}
	if !protocol.ValidTenant(ref.Tenant) {
		return ref, apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)
	}
	return ref, nil
}

func (s *Service) handleCancel(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref, e := decodeRef(m.Data)
	if e != nil {
		reply(m, protocol.APIReply{Error: e})
		return
	}
	if st, err := s.lookup(ctx, ref); err == nil && st.State.Terminal() {
		reply(m, protocol.APIReply{Status: st, Error: apiError("already_finished", "the query already ended as "+string(st.State))})
		return
	}
	// Published to the stream: a worker that picks the job up later still
	// sees it, so a queued job is never started.
	if err := s.publishJSON(ctx, s.names.QueryCtl(ref.Tenant, ref.ID), protocol.CtlOp{Op: protocol.OpCancel}, ""); err != nil {
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
		return
	}
	s.log.Info().Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("cancel requested")
	reply(m, protocol.APIReply{OK: true})
}

func (s *Service) handleStatus(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref, e := decodeRef(m.Data)
	if e != nil {
		reply(m, protocol.APIReply{Error: e})
		return
	}
	st, err := s.lookup(ctx, ref)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeNotFound, "no query "+ref.Tenant+"/"+ref.ID)})
	case err != nil:
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
	default:
		reply(m, protocol.APIReply{OK: true, Status: st})
	}
}

// lookup finds a query's latest status: the index first, then the stream
// (the index may lag behind by a moment).
func (s *Service) lookup(ctx context.Context, ref protocol.QueryRef) (*protocol.StatusEvent, error) {
	var best *protocol.StatusEvent
	if ev, err := storage.GetStatus(ctx, s.cfg.Status, ref.Tenant, ref.ID); err == nil {
		best = ev
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	if st, err := s.js.Stream(ctx, s.names.QueriesStream()); err == nil {
		if raw, err := st.GetLastMsgForSubject(ctx, s.names.QueryStatus(ref.Tenant, ref.ID)); err == nil {
			var ev protocol.StatusEvent
			if json.Unmarshal(raw.Data, &ev) == nil && (best == nil || storage.Newer(ev, *best)) {
				best = &ev
			}
		}
	}
	if best == nil {
		return nil, storage.ErrNotFound
	}
	return best, nil
}

func (s *Service) handleList(m *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var req protocol.ListRequest
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply(m, protocol.APIReply{Error: apiError(protocol.CodeInvalidJob, "request must be JSON {tenant,state,limit}")})
			return
		}
	}
	if req.Tenant != "" && !protocol.ValidTenant(req.Tenant) {
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)})
		return
	}
	limit := req.Limit
	if limit <= 0 || limit > 1000 {
		limit = 50
	}
	all, err := storage.ListStatus(ctx, s.cfg.Status, req.Tenant, 0)
	if err != nil {
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
		return
	}
	out := make([]protocol.StatusEvent, 0, limit)
	for _, ev := range all {
		if req.State != "" && ev.State != req.State {
			continue
		}
		out = append(out, ev)
		if len(out) == limit {
			break
		}
	}
	reply(m, protocol.APIReply{OK: true, Queries: out})
}

// indexLoop keeps the status index: every status event goes to storage.
// It takes whatever events are queued (up to indexBatch), keeps the newest
// per query (storage.Newer), writes those, then acks the batch; a failed
// write naks that query's events for a retry.
func (s *Service) indexLoop(cc jetstream.ConsumeContext) {
	defer close(s.indexDone)
	const (
		indexBatch  = 512
		indexLinger = 100 * time.Millisecond
	)
	for {
		var first jetstream.Msg
		select {
		case first = <-s.indexQ:
		case <-cc.Closed():
			return
		}
		// Linger a moment so a short query's events (running, then its
		// terminal one) become one write. Lookups also read the stream, so
		// the index may lag this much.
		batch := []jetstream.Msg{first}
		linger := time.NewTimer(indexLinger)
	drain:
		for len(batch) < indexBatch {
			select {
			case m := <-s.indexQ:
				batch = append(batch, m)
			case <-linger.C:
				break drain
			case <-cc.Closed():
				break drain
			}
		}
		linger.Stop()
		s.indexBatch(batch)
	}
}

func (s *Service) indexBatch(batch []jetstream.Msg) {
	type entry struct {
		ev   protocol.StatusEvent
		msgs []jetstream.Msg
	}
	newest := map[string]*entry{}
	var order []string
	for _, m := range batch {
		var ev protocol.StatusEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !protocol.ValidID(ev.ID) || !protocol.ValidTenant(ev.Tenant) {
			s.log.Warn().Str("subject", m.Subject()).Msg("unreadable status event; skipping it")
			_ = m.Term()
			continue
		}
		key := storage.StatusKey(ev.Tenant, ev.ID)
		e := newest[key]
		if e == nil {
			e = &entry{ev: ev}
			newest[key] = e
			order = append(order, key)
		} else if storage.Newer(ev, e.ev) {
			e.ev = ev
		}
		e.msgs = append(e.msgs, m)
	}
	for _, key := range order {
		e := newest[key]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := storage.PutStatus(ctx, s.cfg.Status, e.ev)
		cancel()
		for _, m := range e.msgs {
			if err != nil {
				_ = m.NakWithDelay(2 * time.Second)
			} else {
				_ = m.Ack()
			}
		}
		if err != nil {
			s.log.Warn().Err(err).Str("query_id", e.ev.ID).Msg("indexing status failed; will retry")
		}
	}
}

// advisory is the max-deliveries advisory of the work consumer.
type advisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// deadLetter handles one max-deliveries advisory.
func (s *Service) deadLetter(m jetstream.Msg) {
	var adv advisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 {
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.handleDeadLetter(ctx, adv); err != nil {
		s.log.Error().Err(err).Uint64("stream_seq", adv.StreamSeq).Msg("dead letter failed; will retry")
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	_ = m.Ack()
}

func (s *Service) handleDeadLetter(ctx context.Context, adv advisory) error {
	n := s.names
	jobs, err := s.js.Stream(ctx, n.JobsStream())
	if err != nil {
		return err
	}
	raw, err := jobs.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already handled
	}
	if err != nil {
		return fmt.Errorf("reading job %d: %w", adv.StreamSeq, err)
	}
	tenant, _ := n.ParseJobSubject(raw.Subject)
	id, bodyTenant := protocol.ProbeIdentity(raw.Header.Get(protocol.HeaderContentType), raw.Data)
	tenant = cmp.Or(tenant, bodyTenant, protocol.DefaultTenant)
	attempt := int(adv.Deliveries)
	// Copy the job to the dead-letter subject with the reason.
	dl := nats.NewMsg(n.DLQ(tenant))
	dl.Data = raw.Data
	for k, v := range raw.Header {
		dl.Header[k] = v
	}
	dl.Header.Set(protocol.HeaderReason, protocol.CodeMaxDeliveries)
	dl.Header.Set("Fleet-Deliveries", strconv.FormatUint(adv.Deliveries, 10))
	dl.Header.Set("Fleet-Stream-Seq", strconv.FormatUint(adv.StreamSeq, 10))
	dl.Header.Set(protocol.HeaderMsgID, "dlq-"+n.JobsStream()+"-"+strconv.FormatUint(adv.StreamSeq, 10))
	if _, err := s.js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("copying job %d to the dead letters: %w", adv.StreamSeq, err)
	}
	if protocol.ValidID(id) && protocol.ValidTenant(tenant) {
		if err := s.endQuery(ctx, tenant, id, attempt, adv.StreamSeq); err != nil {
			return err
		}
	}
	if err := jobs.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("removing job %d from the work queue: %w", adv.StreamSeq, err)
	}
	s.log.Warn().Str("tenant", tenant).Str("query_id", id).Uint64("deliveries", adv.Deliveries).Msg("job dead-lettered")
	return nil
}

// endQuery gives a dead-lettered query its synthetic result (on the stream
// and in the transcript) and its failed status, unless it already ended.
func (s *Service) endQuery(ctx context.Context, tenant, id string, attempt int, jobSeq uint64) error {
	n := s.names
	if st, err := s.lookup(ctx, protocol.QueryRef{ID: id, Tenant: tenant}); err == nil && st.State.Terminal() && st.JobSeq >= jobSeq {
		return nil
	}
	qs, err := s.js.Stream(ctx, n.QueriesStream())
	if err != nil {
		return err
	}
	var lastSeq uint64
	if last, err := qs.GetLastMsgForSubject(ctx, n.QueryMsg(tenant, id)); err == nil {
		lastSeq, _ = strconv.ParseUint(last.Header.Get(protocol.HeaderSeq), 10, 64)
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return err
	}
	seq := lastSeq + 1
	msgText := fmt.Sprintf("dispatcher: the job was delivered %d times without finishing; it was dead-lettered to %s", attempt, n.DLQ(tenant))
	line := protocol.SyntheticResult(protocol.SyntheticInput{Reason: protocol.ReasonMaxDeliveries, Message: msgText})
	pm := nats.NewMsg(n.QueryMsg(tenant, id))
	pm.Data = line
	pm.Header.Set(protocol.HeaderSeq, strconv.FormatUint(seq, 10))
	pm.Header.Set(protocol.HeaderAttempt, strconv.Itoa(attempt))
	pm.Header.Set(protocol.HeaderMsgID, protocol.LineMsgID(tenant, id, attempt, seq))
	pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	if _, err := s.js.PublishMsg(ctx, pm); err != nil {
		return fmt.Errorf("publishing the synthetic result: %w", err)
	}
	chunk := append(append([]byte(nil), line...), '\n')
	if err := s.cfg.Objects.Put(ctx, storage.ChunkKey(tenant, id, seq, attempt), chunk); err != nil {
		return fmt.Errorf("storing the synthetic result: %w", err)
	}
	if err := storage.AssembleTranscript(ctx, s.cfg.Objects, tenant, id); err != nil {
		return fmt.Errorf("assembling the transcript: %w", err)
	}
	ev := protocol.StatusEvent{
		V: protocol.SchemaVersion, ID: id, Tenant: tenant, State: protocol.StateFailed, Attempt: attempt,
		JobSeq: jobSeq, Worker: "dispatcher", At: time.Now().UTC(),
		Error:  apiError(protocol.CodeMaxDeliveries, msgText),
		Result: &protocol.ResultSummary{Subtype: "error_during_execution", IsError: true, Synthetic: true, LastSeq: seq},
	}
	return s.publishJSON(ctx, n.QueryStatus(tenant, id), ev, "")
}
