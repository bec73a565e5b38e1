package dispatcher

// The API: <prefix>.api.{submit,cancel,status,list}, the endpoints of the
// NATS micro service "agentfleet" (see micro.go), served by a queue group so
// several dispatchers share the requests.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

func reply(m micro.Request, v any) {
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

func (s *Service) handleSubmit(m micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job, err := protocol.DecodeJob(m.Headers().Get(protocol.HeaderContentType), m.Data())
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

func (s *Service) handleCancel(m micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref, e := decodeRef(m.Data())
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
	st, err := s.cancelQueued(ctx, ref)
	if err != nil {
		// The cancel is on record; the worker that takes the job ends it.
		s.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("ending the queued query at once")
	}
	if st == nil {
		// A parked session: ended here, or already by the sessions
		// consumer from the .ctl cancel (then the reply says how).
		if st, err = s.cancelParked(ctx, ref.Tenant, ref.ID); err != nil {
			s.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("ending the parked session at once")
		}
	}
	reply(m, protocol.APIReply{OK: true, Status: st})
}

func (s *Service) handleStatus(m micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref, e := decodeRef(m.Data())
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

func (s *Service) handleList(m micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var req protocol.ListRequest
	if len(m.Data()) > 0 {
		if err := json.Unmarshal(m.Data(), &req); err != nil {
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
	if req.DeadLetters {
		dls, err := s.listDeadLetters(ctx, req.Tenant, limit)
		if err != nil {
			reply(m, protocol.APIReply{Error: apiError(protocol.CodeInternal, err.Error())})
			return
		}
		reply(m, protocol.APIReply{OK: true, DeadLetters: dls})
		return
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
