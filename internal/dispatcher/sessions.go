package dispatcher

// Sessions (SPEC 9): the session ops as API requests (<prefix>.api.input,
// .interrupt, .approve, .end), and resuming parked sessions. A durable
// consumer reads every .ctl op of FLEET_QUERIES, and the status index
// (index.go) sees every status event: an input (or end) for a parked
// session, or a parked status with ops stored after the last one the
// session read, enqueues a continuation job through FLEET_JOBS, so
// concurrency and admission apply. Both paths give the continuation the
// same Nats-Msg-Id, so it is enqueued once.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// SessionsConsumer is the durable consumer that resumes parked sessions.
const SessionsConsumer = "dispatcher-sessions"

// sessionOps are the ops served as <prefix>.api.<op>.
var sessionOps = []string{protocol.OpInput, protocol.OpInterrupt, protocol.OpApprove, protocol.OpEnd}

func (s *Service) startSessions(ctx context.Context) error {
	s.mu.Lock()
	api := s.api
	s.mu.Unlock()
	for _, op := range sessionOps {
		// Endpoints of the "agentfleet" micro service (micro.go), in its
		// queue group.
		err := api.AddEndpoint(op, micro.HandlerFunc(func(m micro.Request) { s.handleSessionOp(op, m) }),
			micro.WithEndpointSubject(s.names.APISessionOp(op)))
		if err != nil {
			return fmt.Errorf("dispatcher: endpoint %s: %w", op, err)
		}
	}
	c, err := provision.Consumer(ctx, s.js, s.names.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       SessionsConsumer,
		FilterSubject: s.names.CtlWildcard(), // parked statuses come from the index (index.go)
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 256,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: sessions consumer: %w", err)
	}
	cc, err := c.Consume(s.sessionEvent, jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("dispatcher: sessions: %w", err)
	}
	ttl := s.cfg.SessionTTL
	if ttl <= 0 {
		ttl = 7 * 24 * time.Hour
	}
	every := s.cfg.SessionSweep
	if every <= 0 {
		every = min(ttl/10, time.Minute)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				s.expireParked(sctx, ttl)
			}
		}
	}()
	s.mu.Lock()
	s.consumes = append(s.consumes, cc)
	s.sweepStop = func() { cancel(); <-done }
	s.mu.Unlock()
	return nil
}

// expireParked ends every session parked for longer than ttl with a
// succeeded status (SPEC 9: --session-ttl). The status is a compare-and-set
// on the parked one, so a session resumed meanwhile is left alone.
func (s *Service) expireParked(ctx context.Context, ttl time.Duration) {
	evs, err := storage.ListStatus(ctx, s.cfg.Status, "", 0)
	if err != nil {
		s.log.Warn().Err(err).Msg("listing statuses for parked sessions")
		return
	}
	st, err := s.js.Stream(ctx, s.names.QueriesStream())
	if err != nil {
		return
	}
	for _, ev := range evs {
		if ev.State != protocol.StateParked || time.Since(ev.At) < ttl {
			continue
		}
		subj := s.names.QueryStatus(ev.Tenant, ev.ID)
		raw, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			continue
		}
		var last protocol.StatusEvent
		if json.Unmarshal(raw.Data, &last) != nil || last.State != protocol.StateParked || time.Since(last.At) < ttl {
			continue
		}
		if _, err := s.endParked(ctx, subj, raw.Sequence, last, protocol.StateSucceeded, nil); err != nil {
			continue // resumed meanwhile (the compare-and-set failed), or NATS trouble: next sweep
		}
		s.log.Info().Str("tenant", ev.Tenant).Str("query_id", ev.ID).Msg("parked session expired (--session-ttl)")
	}
}

// endParked ends a parked session with state: a compare-and-set on its
// parked status last (stream sequence seq on subject), so a session resumed
// meanwhile is left alone. The stream already ends with the last turn's
// result line.
func (s *Service) endParked(ctx context.Context, subject string, seq uint64, last protocol.StatusEvent, state protocol.State, why *protocol.ErrorInfo) (*protocol.StatusEvent, error) {
	end := last
	end.State, end.At, end.Worker, end.Error = state, time.Now().UTC(), "", why
	end.CtlSeq = 0
	end.Result = &protocol.ResultSummary{SessionID: last.ClaudeSessionID, LastSeq: resultSeq(last)}
	b, err := json.Marshal(end)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Data = b
	m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fmt.Sprint(seq))
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return nil, err
	}
	// Chunks exist only where a journal stored lines that never reached
	// the stream; the archiver writes the transcript from the stream.
	if err := storage.AssembleTranscript(ctx, s.cfg.Objects, last.Tenant, last.ID); err != nil && !errors.Is(err, storage.ErrNotFound) {
		s.log.Warn().Err(err).Str("query_id", last.ID).Msg("assembling an ended session's transcript")
	}
	return &end, nil
}

// cancelParked ends ref as cancelled if its last status is parked (SPEC 9:
// cancel ends a session as cancelled, parked or not; no worker holds a
// parked one to see the cancel). It returns the status it wrote, the
// query's terminal status if it had ended (another dispatcher's cancel
// may have come first), or nil when the query is neither parked nor ended
// (or was resumed meanwhile: the worker that runs the continuation has the
// cancel on record).
func (s *Service) cancelParked(ctx context.Context, tenant, id string) (*protocol.StatusEvent, error) {
	// From the stream's leader, as cancelQueued reads: the compare-and-set
	// below is against it.
	subject := s.names.QueryStatus(tenant, id)
	for try := 0; ; try++ {
		seq, last, err := fence.LastStatus(ctx, s.cfg.NC, s.names.QueriesStream(), subject)
		switch {
		case err != nil || last == nil:
			return nil, err
		case last.State.Terminal():
			return last, nil
		case last.State != protocol.StateParked || try > 0:
			return nil, nil
		}
		end, err := s.endParked(ctx, subject, seq, *last, protocol.StateCancelled, &protocol.ErrorInfo{
			Code: protocol.CodeCancelled, Message: "dispatcher: the session was cancelled while parked"})
		if fence.WrongLastSequence(err) {
			continue // resumed or ended meanwhile: look once more
		}
		if err != nil {
			return nil, err
		}
		s.log.Info().Str("tenant", tenant).Str("query_id", id).Msg("parked session cancelled")
		return end, nil
	}
}

func resultSeq(ev protocol.StatusEvent) uint64 {
	if ev.Result != nil {
		return ev.Result.LastSeq
	}
	return 0
}

// handleSessionOp serves <prefix>.api.<op>: {"id","tenant",…op fields}.
func (s *Service) handleSessionOp(op string, m micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref, ctl, e := decodeSessionOp(op, m.Data())
	if e != nil {
		reply(m, protocol.APIReply{Error: e})
		return
	}
	st, err := s.lookup(ctx, ref)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeNotFound, "no query "+ref.Tenant+"/"+ref.ID)})
		return
	case err != nil:
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
		return
	case st.State.Terminal():
		reply(m, protocol.APIReply{Status: st, Error: apiError("already_finished", "the query already ended as "+string(st.State))})
		return
	}
	if err := s.publishJSON(ctx, s.names.QueryCtl(ref.Tenant, ref.ID), ctl, ""); err != nil {
		reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
		return
	}
	reply(m, protocol.APIReply{OK: true, Status: st})
}

// decodeSessionOp reads a <prefix>.api.<op> request: the query and the op's
// fields, validated as a .ctl op.
func decodeSessionOp(op string, data []byte) (protocol.QueryRef, protocol.CtlOp, *protocol.ErrorInfo) {
	ref, e := decodeRef(data)
	if e != nil {
		return ref, protocol.CtlOp{}, e
	}
	var req protocol.SessionOpRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return ref, protocol.CtlOp{}, apiError(protocol.CodeInvalidJob, err.Error())
	}
	ctl := protocol.CtlOp{Op: op, SessionOp: req.SessionOp}
	if err := ctl.Validate(); err != nil {
		return ref, protocol.CtlOp{}, apiError(protocol.CodeInvalidJob, err.Error())
	}
	return ref, ctl, nil
}

// sessionEvent handles one .ctl op or status event.
func (s *Service) sessionEvent(m jetstream.Msg) {
	tenant, id, kind, ok := s.names.ParseQuerySubject(m.Subject())
	if !ok {
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	switch kind {
	case "ctl":
		op, derr := protocol.DecodeCtlOp(m.Headers().Get(protocol.HeaderContentType), m.Data())
		switch {
		case derr != nil:
			_ = m.Ack()
			return
		case op.Op == protocol.OpCancel:
			_, err = s.cancelParked(ctx, tenant, id)
		case op.Op == protocol.OpInput || op.Op == protocol.OpEnd:
			err = s.resumeIfParked(ctx, tenant, id)
		default:
			_ = m.Ack()
			return
		}
	case "status":
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data(), &ev) != nil || ev.State != protocol.StateParked {
			_ = m.Ack()
			return
		}
		err = s.resumeIfParked(ctx, tenant, id)
	default:
		_ = m.Ack()
		return
	}
	if err != nil {
		s.log.Warn().Err(err).Str("tenant", tenant).Str("query_id", id).Msg("resuming a parked session; will retry")
		_ = m.NakWithDelay(2 * time.Second)
		return
	}
	_ = m.Ack()
}

// resumeIfParked enqueues a continuation when the query's latest status is
// parked and an op was stored after the last one the session read.
func (s *Service) resumeIfParked(ctx context.Context, tenant, id string) error {
	st, err := s.js.Stream(ctx, s.names.QueriesStream())
	if err != nil {
		return err
	}
	raw, err := st.GetLastMsgForSubject(ctx, s.names.QueryStatus(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var ev protocol.StatusEvent
	if json.Unmarshal(raw.Data, &ev) != nil || ev.State != protocol.StateParked {
		return nil
	}
	ctl, err := st.GetLastMsgForSubject(ctx, s.names.QueryCtl(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && ctl.Sequence <= ev.CtlSeq) {
		return nil // nothing new for the session
	}
	if err != nil {
		return err
	}
	cp, err := session.Load(ctx, s.cfg.Objects, tenant, id)
	if err != nil {
		return fmt.Errorf("the parked session's checkpoint: %w", err)
	}
	job := *cp.Job
	sess := *job.Session
	sess.Continuation = true
	job.Session = &sess
	body, err := json.Marshal(job)
	if err != nil {
		return err
	}
	jm := nats.NewMsg(s.names.JobSubject(tenant))
	jm.Data = body
	jm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	jm.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("%s.%s.resume.%d.%d", tenant, id, ev.JobSeq, ev.Turn))
	ack, err := s.js.PublishMsg(ctx, jm)
	if err != nil {
		return err
	}
	if !ack.Duplicate {
		s.log.Info().Str("tenant", tenant).Str("query_id", id).Msg("parked session resumed: continuation queued")
	}
	return nil
}
