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

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// advisory is the max-deliveries advisory of the work consumer.
type advisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// deadLetters turns the work consumer's max-delivery advisories (the
// durable consumer DLQConsumer) into dead letters, and lists them.
type deadLetters struct {
	queryDeps
	index *statusIndex
	end   *ender

	consumed
	// testBeforeEnd, in tests, runs between reading a dead-lettered
	// query's status and ending it (the window a worker can write in).
	testBeforeEnd func()
}

// start makes (or finds) the consumer and consumes the advisories.
func (d *deadLetters) start(ctx context.Context) error {
	dlq, err := provision.Consumer(ctx, d.js, d.names.AdvisoryStream(), jetstream.ConsumerConfig{
		Durable:       DLQConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       time.Minute,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: dead-letter consumer: %w", err)
	}
	cc, err := dlq.Consume(d.onAdvisory, jetstream.PullMaxMessages(16))
	if err != nil {
		return fmt.Errorf("dispatcher: dead letters: %w", err)
	}
	d.cc = cc
	return nil
}

// onAdvisory handles one max-deliveries advisory.
func (d *deadLetters) onAdvisory(m jetstream.Msg) {
	var adv advisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 {
		_ = m.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.handle(ctx, adv); err != nil {
		d.log.Error().Err(err).Uint64("stream_seq", adv.StreamSeq).Msg("dead letter failed; will retry")
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	_ = m.Ack()
}

func (d *deadLetters) handle(ctx context.Context, adv advisory) error {
	n := d.names
	jobs, err := d.js.Stream(ctx, n.JobsStream())
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
	if _, err := d.js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("copying job %d to the dead letters: %w", adv.StreamSeq, err)
	}
	if protocol.ValidID(id) && protocol.ValidTenant(tenant) {
		// An admitted job names its submission's sequence.
		jobSeq := adv.StreamSeq
		if v, err := strconv.ParseUint(raw.Header.Get(protocol.HeaderJobSeq), 10, 64); err == nil && v > 0 {
			jobSeq = v
		}
		if err := d.endQuery(ctx, tenant, id, attempt, jobSeq); err != nil {
			return err
		}
	}
	if err := jobs.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("removing job %d from the work queue: %w", adv.StreamSeq, err)
	}
	d.log.Warn().Str("tenant", tenant).Str("query_id", id).Uint64("deliveries", adv.Deliveries).Msg("job dead-lettered")
	return nil
}

// endQuery gives a dead-lettered query its synthetic result (on the stream
// and in the transcript) and its failed status, unless it ended already.
// The ending compare-and-sets against the status it read, so a worker
// still finishing the last delivery and the dispatcher never both end the
// query: whichever writes second finds the status moved and stands aside.
func (d *deadLetters) endQuery(ctx context.Context, tenant, id string, attempt int, jobSeq uint64) error {
	if st, err := d.index.lookup(ctx, protocol.QueryRef{ID: id, Tenant: tenant}); err == nil && st.State.Terminal() && st.JobSeq >= jobSeq {
		return nil
	}
	qs, err := d.js.Stream(ctx, d.names.QueriesStream())
	if err != nil {
		return err
	}
	for range 5 {
		var statusSeq uint64
		var lastErr *protocol.ErrorInfo // why the last attempt failed, when it said
		raw, err := qs.GetLastMsgForSubject(ctx, d.names.QueryStatus(tenant, id))
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
		if d.testBeforeEnd != nil {
			d.testBeforeEnd()
		}
		ended, err := d.end.end(ctx, ending{
			tenant: tenant, id: id, attempt: attempt, jobSeq: jobSeq, expectStatusSeq: statusSeq,
			state: protocol.StateFailed, reason: protocol.ReasonMaxDeliveries, code: protocol.CodeMaxDeliveries,
			message: deadLetterMessage(attempt, d.names.DLQ(tenant), lastErr),
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

// deadLetterScan bounds how many dead letters one listing reads (a tenant
// filter skips other tenants' ones).
const deadLetterScan = 10000

// listDeadLetters returns the newest limit dead letters (of tenant, or of
// all tenants when tenant is ""), newest first. It reads the stream
// backwards message by message: no consumer is created.
func (d *deadLetters) list(ctx context.Context, tenant string, limit int) ([]protocol.DeadLetter, error) {
	n := d.names
	st, err := d.js.Stream(ctx, n.DLQStream())
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
