package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// deadLetter copies a job the worker is about to terminate as invalid to the
// dead-letter stream, with its reason, so that a body nobody can read (not
// JSON, no id) is still there for an operator to find (dispatcher ls --dlq)
// after the work queue dropped it. The copy is deduplicated by the job's
// stream sequence, so a retry after a failed Term adds nothing.
func deadLetter(ctx context.Context, js jetstream.JetStream, names protocol.Names, msg jetstream.Msg, tenant, reason string) error {
	if tenant == "" {
		if _, err := names.ParseJobSubject(msg.Subject()); err != nil {
			// Its subject names no tenant: not the default tenant's.
			tenant = protocol.InvalidTenantDLQ
		}
	}
	dl := nats.NewMsg(names.DLQ(cmp.Or(tenant, protocol.DefaultTenant)))
	dl.Data = msg.Data()
	for k, v := range msg.Headers() {
		dl.Header[k] = v
	}
	dl.Header.Set(protocol.HeaderReason, protocol.CodeInvalidJob)
	dl.Header.Set(protocol.HeaderError, reason)
	msgID := "dlq-" + names.JobsStream() + "-" + msg.Subject()
	if md, err := msg.Metadata(); err == nil {
		seq := strconv.FormatUint(md.Sequence.Stream, 10)
		dl.Header.Set(protocol.HeaderStreamSeq, seq)
		msgID = "dlq-" + names.JobsStream() + "-" + seq
	}
	dl.Header.Set(protocol.HeaderMsgID, msgID)
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("copying the invalid job to %s: %w", dl.Subject, err)
	}
	return nil
}

// reject terminates an invalid job and, when its id and tenant are
// readable, publishes a failed status with code invalid_job.
func (w *Worker) reject(msg jetstream.Msg, job *protocol.Job, tenant string, attempt int, cause error) {
	id := ""
	if job != nil {
		id = job.ID
		if job.Tenant != "" && protocol.ValidTenant(job.Tenant) && tenant == "" {
			tenant = job.Tenant
		}
	}
	if id == "" {
		id, _ = protocol.ProbeIdentity(msg.Headers().Get(protocol.HeaderContentType), msg.Data())
	}
	reason := cause.Error()
	if len(reason) > 512 {
		reason = reason[:512]
	}
	w.log.Warn().Str("tenant", tenant).Str("query_id", id).Str("reason", reason).Msg("invalid job; terminating it")
	dctx, dcancel := context.WithTimeout(context.Background(), apiTimeout)
	err := deadLetter(dctx, w.js, w.names, msg, tenant, reason)
	dcancel()
	if err != nil {
		// Terminated now, it would be lost: keep it until it can be copied.
		w.log.Error().Err(err).Msg("dead-lettering an invalid job; it stays queued")
		_ = msg.NakWithDelay(backoff(uint64(attempt)))
		return
	}
	if err := msg.TermWithReason(reason); err != nil {
		w.log.Error().Err(err).Msg("terminating an invalid job")
	}
	w.metrics.jobs.WithLabelValues("invalid").Inc()
	if !protocol.ValidID(id) || !protocol.ValidTenant(tenant) {
		return
	}
	ev := protocol.StatusEvent{
		ID: id, Tenant: tenant, State: protocol.StateFailed, Attempt: attempt,
		Error: &protocol.ErrorInfo{Code: rejectCode(cause), Message: reason},
	}
	ev.JobSeq = jobSeqOf(msg)
	if job != nil {
		ev.Metadata = job.Metadata
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := publishStatus(ctx, w.js, w.names, w.cfg.ID, ev); err != nil {
		w.log.Error().Err(err).Msg("publishing the invalid_job status")
	}
}

// publishStatus publishes ev, outside any attempt's fence (an invalid job
// has no attempt).
func publishStatus(ctx context.Context, js jetstream.JetStream, names protocol.Names, worker string, ev protocol.StatusEvent) error {
	ev.V = protocol.SchemaVersion
	ev.Worker = worker
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	m := nats.NewMsg(names.QueryStatus(ev.Tenant, ev.ID))
	m.Data = b
	m.Header.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	_, err = js.PublishMsg(ctx, m)
	return err
}

// badSubject is the reason a job whose subject names no valid tenant is
// refused: it names the subject the producer published on (the admitted
// copy's header says which), why it is refused, and where to publish.
func badSubject(names protocol.Names, msg jetstream.Msg) error {
	origin := msg.Subject()
	if h := msg.Headers().Get(protocol.HeaderSubject); h != "" {
		origin = h
	}
	why := "it names no tenant"
	if _, err := names.ParseJobSubject(origin); err != nil {
		why = strings.TrimPrefix(strings.TrimPrefix(err.Error(), "protocol: "), "invalid job: ")
	}
	return fmt.Errorf("%w: the job came on %s, which is refused (%s); publish jobs on %s.jobs.<tenant>, a tenant matching %s",
		protocol.ErrInvalidJob, origin, why, names.Prefix(), protocol.TenantPattern)
}
