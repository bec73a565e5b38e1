package dispatcher

// Sessions (docs/sessions.md): resuming parked sessions (the session ops arrive as
// API requests, <prefix>.api.input, .interrupt, .approve, .end: api.go
// records them on the query's .ctl subject). A durable
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

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// SessionsConsumer is the durable consumer that resumes parked sessions.
const SessionsConsumer = "dispatcher-sessions"

// sessions resumes parked sessions (the durable consumer
// SessionsConsumer of every .ctl op; the status index hands it parked
// statuses), ends them on cancel, and expires those parked past the TTL.
type sessions struct {
	queryDeps
	ttl, every time.Duration

	// queued ends a cancelled query still waiting in the queue: a cancel
	// sent on the .ctl subject (not through the API) ends it as it is
	// read, not when a worker is given the job after a slot frees.
	queued *queuedCancel

	consumed
	// sweepStop stops the parked-session expiry loop.
	sweepStop func()
}

func newSessions(q queryDeps, ttl, every time.Duration) *sessions {
	if ttl <= 0 {
		ttl = 7 * 24 * time.Hour
	}
	if every <= 0 {
		every = min(ttl/10, time.Minute)
	}
	return &sessions{queryDeps: q, ttl: ttl, every: every}
}

// start makes (or finds) the consumer and starts the expiry sweep.
func (ss *sessions) start(ctx context.Context) error {
	c, err := provision.Consumer(ctx, ss.js, ss.names.QueriesStream(), jetstream.ConsumerConfig{
		Durable:       SessionsConsumer,
		FilterSubject: ss.names.CtlWildcard(), // parked statuses come from the index (index.go)
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 256,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: sessions consumer: %w", err)
	}
	cc, err := c.Consume(ss.onEvent, jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("dispatcher: sessions: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ss.every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				ss.expireParked(sctx, ss.ttl)
			}
		}
	}()
	ss.cc, ss.sweepStop = cc, func() { cancel(); <-done }
	return nil
}

// stop ends the sweep, then drains the consumer.
func (ss *sessions) stop(ctx context.Context) error {
	if ss.sweepStop != nil {
		ss.sweepStop()
		ss.sweepStop = nil
	}
	return ss.consumed.stop(ctx)
}

// expireParked ends every session parked for longer than ttl with a
// succeeded status (docs/sessions.md: --session-ttl). The status is a compare-and-set
// on the parked one, so a session resumed meanwhile is left alone.
func (ss *sessions) expireParked(ctx context.Context, ttl time.Duration) {
	evs, err := storage.ListStatus(ctx, ss.statusStore, "", 0)
	if err != nil {
		ss.log.Warn().Err(err).Msg("listing statuses for parked sessions")
		return
	}
	st, err := ss.js.Stream(ctx, ss.names.QueriesStream())
	if err != nil {
		return
	}
	for _, ev := range evs {
		if ev.State != protocol.StateParked || time.Since(ev.At) < ttl {
			continue
		}
		subj := ss.names.QueryStatus(ev.Tenant, ev.ID)
		raw, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			continue
		}
		var last protocol.StatusEvent
		if json.Unmarshal(raw.Data, &last) != nil || last.State != protocol.StateParked || time.Since(last.At) < ttl {
			continue
		}
		if _, err := ss.endParked(ctx, subj, raw.Sequence, last, protocol.StateSucceeded, nil); err != nil {
			continue // resumed meanwhile (the compare-and-set failed), or NATS trouble: next sweep
		}
		ss.log.Info().Str("tenant", ev.Tenant).Str("query_id", ev.ID).Msg("parked session expired (--session-ttl)")
	}
}

// endParked ends a parked session with state: a compare-and-set on its
// parked status last (stream sequence seq on subject), so a session resumed
// meanwhile is left alone. The stream already ends with the last turn's
// result line.
func (ss *sessions) endParked(ctx context.Context, subject string, seq uint64, last protocol.StatusEvent, state protocol.State, why *protocol.ErrorInfo) (*protocol.StatusEvent, error) {
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
	if _, err := ss.js.PublishMsg(ctx, m); err != nil {
		return nil, err
	}
	// Chunks exist only where a journal stored lines that never reached
	// the stream; the archiver writes the transcript from the stream.
	if err := storage.AssembleTranscript(ctx, ss.objects, last.Tenant, last.ID); err != nil && !errors.Is(err, storage.ErrNotFound) {
		ss.log.Warn().Err(err).Str("query_id", last.ID).Msg("assembling an ended session's transcript")
	}
	return &end, nil
}

// cancelParked ends ref as cancelled if its last status is parked (docs/sessions.md:
// cancel ends a session as cancelled, parked or not; no worker holds a
// parked one to see the cancel). It returns the status it wrote, the
// query's terminal status if it had ended (another dispatcher's cancel
// may have come first), or nil when the query is neither parked nor ended
// (or was resumed meanwhile: the worker that runs the continuation has the
// cancel on record).
func (ss *sessions) cancelParked(ctx context.Context, tenant, id string) (*protocol.StatusEvent, error) {
	// From the stream's leader, as cancelQueued reads: the compare-and-set
	// below is against it.
	subject := ss.names.QueryStatus(tenant, id)
	for try := 0; ; try++ {
		seq, last, err := fence.LastStatus(ctx, ss.nc, ss.names.QueriesStream(), subject)
		switch {
		case err != nil || last == nil:
			return nil, err
		case last.State.Terminal():
			return last, nil
		case last.State != protocol.StateParked || try > 0:
			return nil, nil
		}
		end, err := ss.endParked(ctx, subject, seq, *last, protocol.StateCancelled, &protocol.ErrorInfo{
			Code: protocol.CodeCancelled, Message: "dispatcher: the session was cancelled while parked"})
		if fence.WrongLastSequence(err) {
			continue // resumed or ended meanwhile: look once more
		}
		if err != nil {
			return nil, err
		}
		ss.log.Info().Str("tenant", tenant).Str("query_id", id).Msg("parked session cancelled")
		return end, nil
	}
}

// cancel ends tenant/id at once on a .ctl cancel when no worker holds it:
// still queued, or a parked session.
func (ss *sessions) cancel(ctx context.Context, tenant, id string) error {
	if ss.queued != nil {
		st, err := ss.queued.cancelQueued(ctx, protocol.QueryRef{Tenant: tenant, ID: id})
		if err != nil || st != nil {
			return err
		}
	}
	_, err := ss.cancelParked(ctx, tenant, id)
	return err
}

func resultSeq(ev protocol.StatusEvent) uint64 {
	if ev.Result != nil {
		return ev.Result.LastSeq
	}
	return 0
}

// onEvent handles one .ctl op or status event.
func (ss *sessions) onEvent(m jetstream.Msg) {
	tenant, id, kind, ok := ss.names.ParseQuerySubject(m.Subject())
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
			err = ss.cancel(ctx, tenant, id)
		case op.Op == protocol.OpInput || op.Op == protocol.OpEnd:
			err = ss.resumeIfParked(ctx, tenant, id)
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
		err = ss.resumeIfParked(ctx, tenant, id)
	default:
		_ = m.Ack()
		return
	}
	if err != nil {
		ss.log.Warn().Err(err).Str("tenant", tenant).Str("query_id", id).Msg("resuming a parked session; will retry")
		_ = m.NakWithDelay(2 * time.Second)
		return
	}
	_ = m.Ack()
}

// resumeIfParked enqueues a continuation when the query's latest status is
// parked and an op was stored after the last one the session read.
func (ss *sessions) resumeIfParked(ctx context.Context, tenant, id string) error {
	st, err := ss.js.Stream(ctx, ss.names.QueriesStream())
	if err != nil {
		return err
	}
	raw, err := st.GetLastMsgForSubject(ctx, ss.names.QueryStatus(tenant, id))
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
	ctl, err := st.GetLastMsgForSubject(ctx, ss.names.QueryCtl(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && ctl.Sequence <= ev.CtlSeq) {
		return nil // nothing new for the session
	}
	if err != nil {
		return err
	}
	cp, err := session.Load(ctx, ss.objects, tenant, id)
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
	jm := nats.NewMsg(ss.names.JobSubject(tenant))
	jm.Data = body
	jm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	jm.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("%s.%s.resume.%d.%d", tenant, id, ev.JobSeq, ev.Turn))
	ack, err := ss.js.PublishMsg(ctx, jm)
	if err != nil {
		return err
	}
	if !ack.Duplicate {
		ss.log.Info().Str("tenant", tenant).Str("query_id", id).Msg("parked session resumed: continuation queued")
	}
	return nil
}
