package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/internal/relay"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// settle ends a run with a terminal outcome: every line in the stream, then
// the status, then the ack. The terminal status is made here, in one
// place: terminalStatus (outcome.go) from the agent's result, then the
// mode's part (mode.finish: a session's turn, a workspace's artifact).
func (q *query) settle(rel *relay.Relay, jl journalCloser, out agent.Outcome, started time.Time) {
	w := q.w
	// The status is published only once every line of the attempt is
	// stored: if they cannot all be, the job is handed back and the next
	// attempt continues after what is stored.
	fctx, cancel := context.WithTimeout(context.Background(), w.cfg.FlushTimeout)
	defer cancel()
	if !q.flushed(fctx, rel, jl, "flushing") {
		return
	}
	if err := jl.Close(true); err != nil {
		q.log.Error().Err(err).Msg("closing the journal")
	}
	ev := terminalStatus(out)
	ev.Result.Lines = out.Lines
	ev.Result.LastSeq = rel.Seq()
	ev = q.mode.finish(fctx, ev)
	switch v, err := q.fw.Publish(fctx, q.event(ev)); {
	case err != nil:
		// Unknown whether it is stored: the next attempt reads it back
		// (and acks the job without running it if it is).
		q.retry(fmt.Errorf("publishing the terminal status: %w", err), "")
		return
	case v == fence.Superseded || v == fence.Replaced:
		q.stepAside(v, "before the terminal status")
		return
	case v == fence.Finished:
		q.log.Warn().Msg("another writer ended the query first; acking")
	}
	q.ack(context.Background())
	w.metrics.jobs.WithLabelValues(string(ev.State)).Inc()
	w.metrics.runDuration.Observe(time.Since(started).Seconds())
	q.log.Info().Str("state", string(ev.State)).Uint64("lines", out.Lines).Dur("took", time.Since(started)).Msg("job done")
}

// park ends this job of a parked session: every line in the stream, the
// journal persisted (so a continuation may open it again at once), the
// parked status, then the ack. No terminal status: the query goes on.
func (q *query) park(rel *relay.Relay, jl journalCloser) {
	w := q.w
	fctx, cancel := context.WithTimeout(context.Background(), w.cfg.FlushTimeout)
	defer cancel()
	if !q.flushed(fctx, rel, jl, "parking") {
		return
	}
	if err := jl.Close(false); err != nil {
		q.log.Error().Err(err).Msg("closing the journal")
	}
	if err := w.cfg.Journal.WaitPersisted(fctx, q.job.Tenant, q.job.ID); err != nil {
		q.log.Warn().Err(err).Msg("the parked session's journal is not persisted yet")
	}
	ev := q.mode.finish(fctx, protocol.StatusEvent{State: protocol.StateParked, Result: &protocol.ResultSummary{LastSeq: rel.Seq()}})
	switch v, err := q.fw.Publish(fctx, q.event(ev)); {
	case err != nil:
		// The checkpoint is stored: the next attempt restores it.
		q.retry(fmt.Errorf("publishing the parked status: %w", err), "")
		return
	case v != fence.Proceed:
		q.stepAside(v, "before the parked status")
		return
	}
	q.ack(context.Background())
	w.metrics.jobs.WithLabelValues(string(protocol.StateParked)).Inc()
	q.log.Info().Int("turn", ev.Turn).Msg("session parked")
}

// flushed waits until every line of the run is in the stream. When they
// cannot all be, it closes the journal (not final: the next attempt or a
// restarted worker continues from it) and either steps aside (fenced: a
// later attempt owns the query) or hands the job back; it then reports
// false and the caller publishes nothing more. while names the step for
// the log.
func (q *query) flushed(ctx context.Context, rel *relay.Relay, jl journalCloser, while string) bool {
	err := rel.Flush(ctx)
	if err == nil {
		return true
	}
	_ = jl.Close(false)
	if errors.Is(err, relay.ErrFenced) {
		q.stepAside(q.fenced.by(), "fenced while "+while)
		return false
	}
	q.retry(fmt.Errorf("not every line reached the stream: %w", err), "")
	return false
}

// event fills in this attempt's fields of a status event.
func (q *query) event(ev protocol.StatusEvent) protocol.StatusEvent {
	ev.V = protocol.SchemaVersion
	ev.ID, ev.Tenant, ev.Attempt, ev.Metadata, ev.JobSeq = q.job.ID, q.job.Tenant, q.attempt, q.job.Metadata, q.jobSeq
	ev.Worker = q.w.cfg.ID
	ev.Session = q.job.Session != nil
	ev.Prompt = protocol.PromptPreview(q.job.Prompt)
	ev.Trigger = q.job.Trigger
	if ev.State == protocol.StateRunning {
		warm := q.warm != nil
		ev.Warm = &warm
	}
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	ev.TraceID = q.traceID()
	q.lastStatus.Store(&ev)
	return ev
}

// status publishes a status of this attempt through the fence (waiting
// for it). A fence that refuses it means a later attempt or another writer
// owns the query: the run is fenced.
func (q *query) status(ev protocol.StatusEvent) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	v, err := q.fw.Publish(ctx, q.event(ev))
	switch {
	case err != nil:
		q.log.Error().Err(err).Str("state", string(ev.State)).Msg("publishing status")
	case v != fence.Proceed:
		q.fenced.set(v)
	default:
		q.markPublished(ev.State)
	}
}

// retry hands the job back with a delay after an infrastructure failure.
func (q *query) retry(cause error, code string) {
	md, _ := q.msg.Metadata()
	var n uint64 = 1
	if md != nil {
		n = md.NumDelivered
	}
	d := backoff(n)
	q.log.Warn().Err(cause).Dur("delay", d).Msg("infrastructure failure; the job will be retried")
	if code != "" && q.fw != nil {
		// Through the fence: a fenced attempt's status is refused.
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		_, err := q.fw.Publish(ctx, q.event(protocol.StatusEvent{
			State: protocol.StateRetrying,
			Error: &protocol.ErrorInfo{Code: code, Message: cause.Error()},
		}))
		cancel()
		if err != nil {
			q.log.Warn().Err(err).Msg("publishing the retrying status")
		}
	}
	_ = q.msg.NakWithDelay(d)
	q.w.metrics.jobs.WithLabelValues("retried").Inc()
}

// ack acks the job, retrying each DoubleAck on its own short context until
// the server confirms it, the job is known to be owned by a later attempt,
// or AckWait has passed (then the job is redelivered, and the redelivery
// finds the terminal status and acks it without running it).
func (q *query) ack(ctx context.Context) {
	w := q.w
	deadline := time.Now().Add(max(q.ackWait, 10*time.Second))
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, w.cfg.PublishTimeout)
		err := q.msg.DoubleAck(actx)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return
		}
		if try == 1 || try%20 == 0 {
			q.log.Warn().Err(err).Int("try", try).Msg("ack failed; retrying")
		}
		if time.Now().After(deadline) {
			q.log.Warn().Err(err).Msg("ack still failing after AckWait; the redelivery will find the terminal status and ack the job")
			return
		}
		if q.fw != nil {
			rctx, cancel := context.WithTimeout(ctx, w.cfg.PublishTimeout)
			v, rerr := q.fw.Recheck(rctx)
			cancel()
			if rerr == nil && v == fence.Superseded {
				q.log.Warn().Msg("a later attempt owns the job; it acks it")
				return
			}
		}
		_ = sleepCtx(ctx, backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

// replacedReason is the term reason of a job a newer submission replaced.
const replacedReason = "replaced by a newer submission of the same id"

// stepAside ends a run that another writer owns (v: the verdict, or
// Proceed when only "fenced" is known and the stream must be asked). A
// later attempt of the same submission owns the job message too: it is left
// alone. A newer submission of the same id does not: this submission will
// never run again, so its message is terminated at once instead of being
// redelivered until max deliveries dead-letters a query that ran (the
// redelivery's claim would come to the same verdict; this frees the slot
// now).
func (q *query) stepAside(v fence.Verdict, while string) {
	w := q.w
	if v == fence.Proceed && q.fw != nil {
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.PublishTimeout)
		rv, err := q.fw.Recheck(ctx)
		cancel()
		if err == nil {
			v = rv
		}
	}
	if v != fence.Replaced {
		w.metrics.jobs.WithLabelValues("fenced").Inc()
		q.log.Warn().Str("verdict", v.String()).Msg("a later attempt owns the query (" + while + "); leaving the job to it")
		return
	}
	w.metrics.jobs.WithLabelValues("replaced").Inc()
	q.log.Warn().Msg("a newer submission of the same id owns the query (" + while + "); terminating this one")
	if err := q.msg.TermWithReason(replacedReason); err != nil {
		q.log.Warn().Err(err).Msg("terminating the replaced job; its redelivery will")
	}
}
