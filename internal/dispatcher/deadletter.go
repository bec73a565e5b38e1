package dispatcher

// Dead letters: a max-deliveries advisory of the work consumer copies the job
// to <prefix>.dlq.<tenant>, ends its query with a synthetic result and a
// failed status, and removes it from the work queue.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

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
	dl.Header.Set(protocol.HeaderStreamSeq, strconv.FormatUint(adv.StreamSeq, 10))
	dl.Header.Set(protocol.HeaderMsgID, "dlq-"+n.JobsStream()+"-"+strconv.FormatUint(adv.StreamSeq, 10))
	if _, err := s.js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("copying job %d to the dead letters: %w", adv.StreamSeq, err)
	}
	if protocol.ValidID(id) && protocol.ValidTenant(tenant) {
		// An admitted job names its submission's sequence.
		jobSeq := adv.StreamSeq
		if v, err := strconv.ParseUint(raw.Header.Get(protocol.HeaderJobSeq), 10, 64); err == nil && v > 0 {
			jobSeq = v
		}
		if err := s.endQuery(ctx, tenant, id, attempt, jobSeq); err != nil {
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
// and in the transcript) and its failed status, unless it ended already.
// The ending compare-and-sets against the status it read, so a worker
// still finishing the last delivery and the dispatcher never both end the
// query: whichever writes second finds the status moved and stands aside.
func (s *Service) endQuery(ctx context.Context, tenant, id string, attempt int, jobSeq uint64) error {
	if st, err := s.lookup(ctx, protocol.QueryRef{ID: id, Tenant: tenant}); err == nil && st.State.Terminal() && st.JobSeq >= jobSeq {
		return nil
	}
	qs, err := s.js.Stream(ctx, s.names.QueriesStream())
	if err != nil {
		return err
	}
	for range 5 {
		var statusSeq uint64
		var lastErr *protocol.ErrorInfo // why the last attempt failed, when it said
		raw, err := qs.GetLastMsgForSubject(ctx, s.names.QueryStatus(tenant, id))
		switch {
		case err == nil:
			var ev protocol.StatusEvent
			if json.Unmarshal(raw.Data, &ev) == nil && ev.State.Terminal() && ev.JobSeq >= jobSeq {
				return nil
			}
			if ev.Error != nil && ev.JobSeq == jobSeq {
				lastErr = ev.Error
			}
			statusSeq = raw.Sequence
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return fmt.Errorf("reading the query's status: %w", err)
		}
		if s.testBeforeEnd != nil {
			s.testBeforeEnd()
		}
		ended, err := s.end(ctx, ending{
			tenant: tenant, id: id, attempt: attempt, jobSeq: jobSeq, expectStatusSeq: statusSeq,
			state: protocol.StateFailed, reason: protocol.ReasonMaxDeliveries, code: protocol.CodeMaxDeliveries,
			message: deadLetterMessage(attempt, s.names.DLQ(tenant), lastErr),
		})
		if err != nil || ended {
			return err
		}
		// The status moved (a worker wrote one): look again.
	}
	return errors.New("the query's status kept changing while it was being dead-lettered")
}

// deadLetterMessage is a dead-lettered query's error message: how often
// it was delivered, where the job went, and what the last attempt said
// went wrong, so the reason reaches the user and not only the retrying
// statuses before it.
func deadLetterMessage(deliveries int, dlq string, last *protocol.ErrorInfo) string {
	msg := fmt.Sprintf("dispatcher: the job was delivered %d times without finishing; it was dead-lettered to %s", deliveries, dlq)
	if last != nil && last.Message != "" {
		msg += "; the last attempt: " + cmp.Or(last.Code, "error") + ": " + last.Message
	}
	return msg
}

// ending is how the dispatcher ends a query no worker will end.
type ending struct {
	tenant, id            string
	attempt               int
	jobSeq                uint64
	state                 protocol.State
	reason, code, message string
	// expectStatusSeq, when not 0, makes the result line and the status
	// compare-and-sets against the query's .status subject: they are stored
	// only while its last message is still that one (the "queued" status a
	// cancel saw), so nothing is written once a worker has claimed the run.
	expectStatusSeq uint64
}

// Headers of a JetStream compare-and-set on another subject of the stream.
const (
	hdrExpectLastSubjectSeq        = "Nats-Expected-Last-Subject-Sequence"
	hdrExpectLastSubjectSeqSubject = "Nats-Expected-Last-Subject-Sequence-Subject"
)

// end writes a query's synthetic result (on the stream, then in the
// transcript) and its terminal status, and reports whether it did. With
// expectStatusSeq set it reports false when a compare-and-set fails: a
// worker has the run.
func (s *Service) end(ctx context.Context, e ending) (bool, error) {
	n := s.names
	qs, err := s.js.Stream(ctx, n.QueriesStream())
	if err != nil {
		return false, err
	}
	var lastSeq uint64
	if last, err := qs.GetLastMsgForSubject(ctx, n.QueryMsg(e.tenant, e.id)); err == nil {
		lastSeq, _ = strconv.ParseUint(last.Header.Get(protocol.HeaderSeq), 10, 64)
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err
	}
	seq := lastSeq + 1
	line := protocol.SyntheticResult(protocol.SyntheticInput{Reason: e.reason, Message: e.message})
	pm := nats.NewMsg(n.QueryMsg(e.tenant, e.id))
	pm.Data = line
	pm.Header.Set(protocol.HeaderSeq, strconv.FormatUint(seq, 10))
	pm.Header.Set(protocol.HeaderAttempt, strconv.Itoa(e.attempt))
	pm.Header.Set(protocol.HeaderMsgID, protocol.LineMsgID(e.tenant, e.id, e.attempt, seq))
	pm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	if e.expectStatusSeq != 0 {
		pm.Header.Set(hdrExpectLastSubjectSeq, strconv.FormatUint(e.expectStatusSeq, 10))
		pm.Header.Set(hdrExpectLastSubjectSeqSubject, n.QueryStatus(e.tenant, e.id))
	}
	if _, err := s.js.PublishMsg(ctx, pm); err != nil {
		if e.expectStatusSeq != 0 && fence.WrongLastSequence(err) {
			return false, nil
		}
		return false, fmt.Errorf("publishing the synthetic result: %w", err)
	}
	chunk := append(append([]byte(nil), line...), '\n')
	if err := s.cfg.Objects.Put(ctx, storage.ChunkKey(e.tenant, e.id, seq, e.attempt), chunk); err != nil {
		return true, fmt.Errorf("storing the synthetic result: %w", err)
	}
	if err := storage.AssembleTranscript(ctx, s.cfg.Objects, e.tenant, e.id); err != nil {
		return true, fmt.Errorf("assembling the transcript: %w", err)
	}
	code := e.code
	ev := protocol.StatusEvent{
		V: protocol.SchemaVersion, ID: e.id, Tenant: e.tenant, State: e.state, Attempt: e.attempt,
		JobSeq: e.jobSeq, Worker: "dispatcher", At: time.Now().UTC(),
		Error:  apiError(code, e.message),
		Result: &protocol.ResultSummary{Subtype: "error_during_execution", IsError: true, Synthetic: true, LastSeq: seq},
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return true, err
	}
	sm := nats.NewMsg(n.QueryStatus(e.tenant, e.id))
	sm.Data = b
	sm.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	var opts []jetstream.PublishOpt
	if e.expectStatusSeq != 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(e.expectStatusSeq))
	}
	if _, err := s.js.PublishMsg(ctx, sm, opts...); err != nil {
		if e.expectStatusSeq != 0 && fence.WrongLastSequence(err) {
			// A worker wrote a status between the two compare-and-sets
			// (it claimed a cancelled run, or finished the last delivery):
			// the run is its to end.
			s.log.Warn().Str("tenant", e.tenant).Str("query_id", e.id).
				Msg("the query's status moved while the dispatcher was ending it (a worker wrote one); the dispatcher's result line stays on the stream")
			return false, nil
		}
		return true, fmt.Errorf("publishing the %s status: %w", e.state, err)
	}
	return true, nil
}

// deadLetterScan bounds how many dead letters one listing reads (a tenant
// filter skips other tenants' ones).
const deadLetterScan = 10000

// listDeadLetters returns the newest limit dead letters (of tenant, or of
// all tenants when tenant is ""), newest first. It reads the stream
// backwards message by message: no consumer is created.
func (s *Service) listDeadLetters(ctx context.Context, tenant string, limit int) ([]protocol.DeadLetter, error) {
	n := s.names
	st, err := s.js.Stream(ctx, n.DLQStream())
	if err != nil {
		return nil, fmt.Errorf("reading the dead letters: %w", err)
	}
	state := st.CachedInfo().State
	out := make([]protocol.DeadLetter, 0, min(limit, int(state.Msgs)))
	for seq, scanned := state.LastSeq, 0; seq >= state.FirstSeq && seq > 0 && len(out) < limit && scanned < deadLetterScan; seq, scanned = seq-1, scanned+1 {
		raw, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading dead letter %d: %w", seq, err)
		}
		if tenant != "" && raw.Subject != n.DLQ(tenant) {
			continue
		}
		out = append(out, deadLetterOf(n, raw))
	}
	return out, nil
}

func deadLetterOf(n protocol.Names, m *jetstream.RawStreamMsg) protocol.DeadLetter {
	h := m.Header
	data := m.Data
	dl := protocol.DeadLetter{
		Seq: m.Sequence, At: m.Time.UTC(),
		Tenant: strings.TrimPrefix(m.Subject, strings.TrimSuffix(n.DLQ("x"), "x")),
		Reason: h.Get(protocol.HeaderReason), Error: h.Get(protocol.HeaderError),
		Body: data[:min(len(data), protocol.DeadLetterBodyBytes)], Bytes: len(data),
	}
	dl.JobSeq, _ = strconv.ParseUint(h.Get(protocol.HeaderStreamSeq), 10, 64)
	if id, _ := protocol.ProbeIdentity(h.Get(protocol.HeaderContentType), data); protocol.ValidID(id) {
		dl.ID = id
	}
	if dl.Error == "" && dl.Reason == protocol.CodeMaxDeliveries {
		dl.Error = "delivered " + h.Get("Fleet-Deliveries") + " times without finishing"
	}
	return dl
}
