package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/directget"
	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// claim reads whether a cancel is on record and claims the query for this
// attempt (package fence): it reads the last status from the stream leader
// and publishes its first status as a compare-and-set on it ("running"; a
// redelivery announces "retrying" first). The last status and the last
// control message are read together (one multi-last direct get on a
// stream of one replica; two leader reads at once on a replicated one).
// It returns baseOf, which reads the Fleet-Seq the attempt continues
// from: that read starts once the claim is stored (no older attempt can
// add a line after it, so what it finds is final) and runs while the
// sandbox is made; the first line waits for it.
func (q *query) claim(ctx context.Context) (baseOf func() (uint64, error), cancelled bool, v fence.Verdict, err error) {
	w, job := q.w, q.job
	q.fw = fence.NewWriter(fence.Config{
		JS: w.js, NC: w.cfg.NC, Stream: w.names.QueriesStream(), Subject: w.names.QueryStatus(job.Tenant, job.ID),
		OneReplica: w.oneReplica,
		Owner:      fence.Owner{JobSeq: q.jobSeq(), Attempt: q.attempt, Worker: w.cfg.ID},
		Timeout:    w.cfg.PublishTimeout,
		OnRetry: func(op string, try int, err error) {
			if try == 1 || try%20 == 0 {
				q.log.Warn().Err(err).Int("try", try).Msg(op + " failed; retrying")
			}
		},
	})
	status, ctl, err := q.readRecord(ctx)
	if err != nil {
		return nil, false, 0, err
	}
	q.fw.Use(status)
	cancelled = q.cancelIn(ctl)
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
			// A workspace job's "running" follows its checkout.
			v, err = q.fw.Publish(ctx, q.event(protocol.StatusEvent{State: protocol.StateRunning}))
		}
	case job.Workspace == nil:
		// Read first, then compare-and-set. (A compare-and-set against
		// "nothing on record" without the read was tried: core
		// subscribers of .status see every publish, stored or refused, so
		// whenever a status is on record, e.g. the dispatcher's "queued",
		// they would see a "running" that never was.)
		v, err = q.fw.Claim(ctx, q.event(protocol.StatusEvent{State: protocol.StateRunning}))
	default:
		// A first attempt whose first status comes after the checkout:
		// its lines are fenced as soon as a later attempt claims.
		v, err = q.fw.Expect(ctx)
	}
	if err != nil || v != fence.Proceed {
		return nil, false, v, err
	}
	return q.readBase(context.WithoutCancel(ctx)), cancelled, fence.Proceed, nil
}

// readRecord reads the query's last status and last control message (nil:
// none), retrying transient failures until ctx ends.
func (q *query) readRecord(ctx context.Context) (status, ctl *jetstream.RawStreamMsg, err error) {
	w, job := q.w, q.job
	subjects := []string{w.names.QueryStatus(job.Tenant, job.ID), w.names.QueryCtl(job.Tenant, job.ID)}
	err = q.retryRead(ctx, "reading the query's status and control history", func(rctx context.Context) error {
		msgs, err := fence.LastMsgsVia(rctx, w.cfg.NC, w.direct, w.names.QueriesStream(), subjects, w.oneReplica())
		if err == nil {
			status, ctl = msgs[0], msgs[1]
		}
		return err
	})
	return status, ctl, err
}

// readBase starts reading the query's last Fleet-Seq (from the stream
// leader) and returns a function that waits for it.
func (q *query) readBase(ctx context.Context) func() (uint64, error) {
	w, job := q.w, q.job
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
		err := q.retryRead(cctx, "reading the query's last line", func(rctx context.Context) error {
			oneReplica := w.oneReplica()
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
			err = q.retryReadFor(cctx, w.cfg.ClaimTimeout, "reading the query's Fleet-Seqs", func(rctx context.Context) (err error) {
				base, err = q.highestSeq(rctx, subject, base)
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
// message, by reading every message. readBase calls it when the subject
// does not hold exactly last messages. (When it does, Fleet-Seqs 1..last
// are each stored once, the usual case, which costs one count read.) On a
// stream of one replica the relay keeps many lines in flight, and a line
// it sends again (lost with a connection, or refused) can be stored after
// later ones, so the last message need not hold the highest Fleet-Seq; a
// line stored a second time, after the stream's duplicate window, is a
// message more. A run that continued from such a last line would reuse
// Fleet-Seqs.
func (q *query) highestSeq(ctx context.Context, subject string, last uint64) (uint64, error) {
	w := q.w
	high := last
	err := w.direct.Each(ctx, w.names.QueriesStream(), subject, 1, func(m *jetstream.RawStreamMsg) error {
		if s, err := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64); err == nil {
			high = max(high, s)
		}
		return nil
	})
	if err == nil && high != last {
		q.log.Warn().Uint64("last_line_seq", last).Uint64("highest_seq", high).
			Msg("the query's lines are stored out of Fleet-Seq order; continuing after the highest")
	}
	return high, err
}

// retryRead calls read, each try bounded by PublishTimeout, until it
// succeeds or ctx ends (then the last failure is returned, as what), with
// a backoff of 50ms doubling to 2s and a warning on the first failure and
// every twentieth.
func (q *query) retryRead(ctx context.Context, what string, read func(context.Context) error) error {
	return q.retryReadFor(ctx, q.w.cfg.PublishTimeout, what, read)
}

// retryReadFor is retryRead with each try bounded by per.
func (q *query) retryReadFor(ctx context.Context, per time.Duration, what string, read func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, per)
		err := read(rctx)
		cancel()
		if err == nil {
			return nil
		}
		if try == 1 || try%20 == 0 {
			q.log.Warn().Err(err).Int("try", try).Msg(what + " failed; retrying")
		}
		if serr := sleepCtx(ctx, backoff); serr != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
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

// jobSeq is the job's sequence in the work-queue stream.
func (q *query) jobSeq() uint64 { return jobSeqOf(q.msg) }

// msgSeq is the work message's own stream sequence (0 when unknown).
func (q *query) msgSeq() uint64 {
	if md, err := q.msg.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// jobSeqOf is the sequence of the job's submission: the admitter's
// Fleet-Job-Seq header on an admitted job, else the message's own.
func jobSeqOf(msg jetstream.Msg) uint64 {
	if v, err := strconv.ParseUint(msg.Headers().Get(protocol.HeaderJobSeq), 10, 64); err == nil && v > 0 {
		return v
	}
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// queuedAt is when the job's submission was stored: the admitter's
// Fleet-Queued-At header on an admitted job, else when it was stored in
// the work queue.
func (q *query) queuedAt() time.Time {
	if v, err := time.Parse(time.RFC3339Nano, q.msg.Headers().Get(protocol.HeaderQueuedAt)); err == nil {
		return v
	}
	md, err := q.msg.Metadata()
	if err != nil {
		return time.Time{}
	}
	return md.Timestamp
}

// cancelIn reports whether ctl, the query's last control message (nil:
// none), is a cancel on record: a {"op":"cancel"} on the query's ctl
// subject (kept by the FLEET_QUERIES stream, so a job cancelled while
// queued is never started) stored after the job itself, so a cancel of an
// earlier run of the same id does not cancel a new submission.
func (q *query) cancelIn(ctl *jetstream.RawStreamMsg) bool {
	if ctl == nil {
		return false
	}
	var op protocol.CtlOp
	return json.Unmarshal(ctl.Data, &op) == nil && op.Op == protocol.OpCancel && !ctl.Time.Before(q.queuedAt())
}

// queriesStream is the FLEET_QUERIES handle, looked up once (a handle is
// only the stream's name and cached info; message gets go to the server).
func (w *Worker) queriesStream(ctx context.Context) (jetstream.Stream, error) {
	w.mu.Lock()
	st := w.queries
	w.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := w.js.Stream(ctx, w.names.QueriesStream())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.queries = st
	w.mu.Unlock()
	return st, nil
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
