package worker

import (
	"context"
	"encoding/json"

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
	return rec.base(context.WithoutCancel(ctx)), cancelled, fence.Proceed, nil
}
