package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// claim reads whether a cancel is on record and claims the query for this
// attempt (package fence): it reads the last status from the stream leader
// and publishes its first status as a compare-and-set on it ("running"; a
// redelivery announces "retrying" first). The last status and the last
// control message are read together (one multi-last direct get on a
// stream of one replica; two leader reads at once on a replicated one).
// A job whose cancel is on record, or reaches it before its first status,
// publishes no "running": it only takes the last status as its token and
// ends "cancelled" (docs/true-statuses.md: a status only for a state the query was in).
// It returns baseOf, which reads the Fleet-Seq the attempt continues
// from: that read starts once the claim is stored (no older attempt can
// add a line after it, so what it finds is final) and runs while the
// sandbox is made; the first line waits for it.
func (q *query) claim(ctx context.Context) (baseOf func() (uint64, error), cancelled bool, v fence.Verdict, err error) {
	w, job := q.w, q.job
	q.fw = fence.NewWriter(fence.Config{
		JS: w.js, NC: w.cfg.NC, Stream: w.names.QueriesStream(), Subject: w.names.QueryStatus(job.Tenant, job.ID),
		OneReplica: w.queries.oneReplica,
		Owner:      fence.Owner{JobSeq: q.jobSeq, Attempt: q.attempt, Worker: w.cfg.ID},
		Timeout:    w.cfg.PublishTimeout,
		OnRetry: func(op string, try int, err error) {
			if try == 1 || try%20 == 0 {
				q.log.Warn().Err(err).Int("try", try).Msg(op + " failed; retrying")
			}
		},
	})
	rec := record{w: w, job: job, log: q.log}
	status, ctl, err := rec.last(ctx)
	if err != nil {
		return nil, false, 0, err
	}
	q.fw.Use(status)
	cancelled = cancelOnRecord(ctl, q.queuedAt)
	if job.Session != nil && job.Session.Continuation && status != nil {
		// A continuation resumes a parked session. One that ended while
		// the continuation waited (cancelled, expired: the dispatcher ends
		// a parked session itself) has nothing to resume: ack, run nothing.
		var last protocol.StatusEvent
		if json.Unmarshal(status.Data, &last) == nil && last.State.Terminal() {
			return nil, false, fence.Finished, nil
		}
	}
	switch {
	case q.attempt > 1:
		// Announces the new attempt before anything else.
		v, err = q.fw.Claim(ctx, q.event(protocol.StatusEvent{State: protocol.StateRetrying}))
		if err == nil && v == fence.Proceed && !cancelled && job.Workspace == nil {
			cancelled = q.cancelledNow()
		}
		if err == nil && v == fence.Proceed && !cancelled && job.Workspace == nil {
			// A workspace job's "running" follows its checkout.
			v, err = q.fw.Publish(ctx, q.event(protocol.StatusEvent{State: protocol.StateRunning}))
		}
	case job.Workspace == nil && !cancelled:
		// Read first, then compare-and-set. (A compare-and-set against
		// "nothing on record" without the read was tried: core
		// subscribers of .status see every publish, stored or refused, so
		// whenever a status is on record, e.g. the dispatcher's "queued",
		// they would see a "running" that never was.)
		v, err = q.fw.Expect(ctx)
		if err == nil && v == fence.Proceed {
			if cancelled = q.cancelledNow(); !cancelled {
				v, err = q.fw.Publish(ctx, q.event(protocol.StatusEvent{State: protocol.StateRunning}))
			}
		}
	default:
		// A job cancelled while queued never runs: its first status is
		// its terminal "cancelled", after the synthetic result line.
		// A first attempt whose first status comes after the checkout:
		// its lines are fenced as soon as a later attempt claims.
		v, err = q.fw.Expect(ctx)
	}
	if err != nil || v != fence.Proceed {
		return nil, false, v, err
	}
	if !cancelled && job.Workspace == nil {
		// "running" is the last status this attempt stored (a workspace
		// job's comes with its checkout; a cancelled job has none).
		q.markPublished(protocol.StateRunning)
	}
	return rec.base(context.WithoutCancel(ctx)), cancelled, fence.Proceed, nil
}

// record reads what the stream holds of one query: its last status and
// control message before the claim, its last Fleet-Seq after it.
type record struct {
	w   *Worker
	job *protocol.Job
	log zerolog.Logger
}

// last reads the query's last status and last control message (nil:
// none), retrying transient failures until ctx ends.
func (rec record) last(ctx context.Context) (status, ctl *jetstream.RawStreamMsg, err error) {
	w, job := rec.w, rec.job
	subjects := []string{w.names.QueryStatus(job.Tenant, job.ID), w.names.QueryCtl(job.Tenant, job.ID)}
	err = rec.retryRead(ctx, "reading the query's status and control history", func(rctx context.Context) error {
		msgs, err := fence.LastMsgsVia(rctx, w.cfg.NC, w.direct, w.names.QueriesStream(), subjects, w.queries.oneReplica())
		if err == nil {
			status, ctl = msgs[0], msgs[1]
		}
		return err
	})
	return status, ctl, err
}

// base starts reading the query's last Fleet-Seq (from the stream
// leader) and returns a function that waits for it.
func (rec record) base(ctx context.Context) func() (uint64, error) {
	w, job := rec.w, rec.job
	type result struct {
		base uint64
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// Retried for up to ClaimTimeout: the agent may already be
		// starting, and a stream leader election must not cost it its run.
		cctx, cancel := context.WithTimeout(ctx, w.cfg.ClaimTimeout)
		defer cancel()
		var base uint64
		var scan bool
		subject := w.names.QueryMsg(job.Tenant, job.ID)
		err := rec.retryRead(cctx, "reading the query's last line", func(rctx context.Context) error {
			oneReplica := w.queries.oneReplica()
			base, scan = 0, false
			m, err := fence.LastMsgVia(rctx, w.cfg.NC, w.names.QueriesStream(), subject, oneReplica)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				return nil
			case err != nil:
				return err
			}
			base, _ = strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64)
			if !oneReplica {
				// One line in flight: lines are stored in Fleet-Seq order.
				return nil
			}
			n, err := w.direct.Count(rctx, w.names.QueriesStream(), subject, 1)
			if errors.Is(err, directget.ErrNoDirect) {
				// Not a stream `dispatcher serve` provisioned (it allows
				// direct gets): continue after the last line, as before.
				return nil
			}
			scan = n != base
			return err
		})
		if err == nil && scan {
			// Each try of the scan may read a long transcript: bounded by
			// what is left of ClaimTimeout, not by PublishTimeout.
			err = rec.retryReadFor(cctx, w.cfg.ClaimTimeout, "reading the query's Fleet-Seqs", func(rctx context.Context) (err error) {
				base, err = rec.highestSeq(rctx, subject, base)
				return err
			})
		}
		ch <- result{base: base, err: err}
	}()
	return sync.OnceValues(func() (uint64, error) {
		r := <-ch
		return r.base, r.err
	})
}

// highestSeq returns the highest Fleet-Seq on the query's .msg subject
// (a stream of one replica), given last, the Fleet-Seq of its last
// message, by reading every message. base calls it when the subject
// does not hold exactly last messages. (When it does, Fleet-Seqs 1..last
// are each stored once, the usual case, which costs one count read.) On a
// stream of one replica the relay keeps many lines in flight, and a line
// it sends again (lost with a connection, or refused) can be stored after
// later ones, so the last message need not hold the highest Fleet-Seq; a
// line stored a second time, after the stream's duplicate window, is a
// message more. A run that continued from such a last line would reuse
// Fleet-Seqs.
func (rec record) highestSeq(ctx context.Context, subject string, last uint64) (uint64, error) {
	w := rec.w
	high := last
	err := w.direct.Each(ctx, w.names.QueriesStream(), subject, 1, func(m *jetstream.RawStreamMsg) error {
		if s, err := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64); err == nil {
			high = max(high, s)
		}
		return nil
	})
	if err == nil && high != last {
		rec.log.Warn().Uint64("last_line_seq", last).Uint64("highest_seq", high).
			Msg("the query's lines are stored out of Fleet-Seq order; continuing after the highest")
	}
	return high, err
}

// retryRead calls read, each try bounded by PublishTimeout, until it
// succeeds or ctx ends (then the last failure is returned, as what), with
// a backoff of 50ms doubling to 2s and a warning on the first failure and
// every twentieth.
func (rec record) retryRead(ctx context.Context, what string, read func(context.Context) error) error {
	return rec.retryReadFor(ctx, rec.w.cfg.PublishTimeout, what, read)
}

// retryReadFor is retryRead with each try bounded by per.
func (rec record) retryReadFor(ctx context.Context, per time.Duration, what string, read func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, per)
		err := read(rctx)
		cancel()
		if err == nil {
			return nil
		}
		if try == 1 || try%20 == 0 {
			rec.log.Warn().Err(err).Int("try", try).Msg(what + " failed; retrying")
		}
		if serr := sleepCtx(ctx, backoff); serr != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// cancelledNow reports whether a cancel reached this run through the
// worker's .ctl subscription (runs.go) since it registered: a cancel
// stored after the claim's read of the .ctl history, before its first
// status. Such a job never ran: it ends "cancelled" without a "running".
func (q *query) cancelledNow() bool {
	return q.runCtx.Err() != nil && errors.Is(context.Cause(q.runCtx), agent.ErrCancelled)
}

// cancelOnRecord reports whether ctl, the query's last control message (nil:
// none), is a cancel on record: a {"op":"cancel"} on the query's ctl
// subject (kept by the FLEET_QUERIES stream, so a job cancelled while
// queued is never started) stored after the job itself, so a cancel of an
// earlier run of the same id does not cancel a new submission.
func cancelOnRecord(ctl *jetstream.RawStreamMsg, queuedAt time.Time) bool {
	if ctl == nil {
		return false
	}
	var op protocol.CtlOp
	return json.Unmarshal(ctl.Data, &op) == nil && op.Op == protocol.OpCancel && !ctl.Time.Before(queuedAt)
}
