package dispatcher

// A cancel of a query still waiting in the work queue ends it at once,
// instead of leaving it "queued" until a worker frees a slot,
// takes the job and only then sees the cancel.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// queuedCancel ends cancelled queries still waiting in the work queue.
type queuedCancel struct {
	queryDeps
	index *statusIndex
	end   *ender
	// fleetCap is this dispatcher's --max-concurrency: a tenant has at
	// most that many jobs on its work subject.
	fleetCap int
}

// cancelQueued ends ref now if its last status is the "queued" of a
// submission no worker has been given yet: it writes the synthetic result
// and the cancelled status (attempt 1, as a worker would for a job
// cancelled before it started), both compare-and-sets against that
// "queued" status, then removes the job from the work queue so no worker
// is given it. It returns the status it wrote, or nil when a worker may
// already have the job (it has the cancel on record and ends the run
// itself) or the query is not queued.
//
// "Not given to a worker yet" is found by undelivered. A job given to a
// worker in the moment between that look and the delete finds the cancel
// on record; if its first
// status lands before the dispatcher's compare-and-sets, the dispatcher
// writes nothing; if it comes after them, the worker's claim (itself a
// compare-and-set, internal/fence) reads the terminal status of the same
// submission and acks the job without running it. Either way the query has
// one terminal status.
//
// The admitter publishes queued statuses of its own (why a job waits, and
// its place), which move the status a compare-and-set expects: a cancel
// that loses to one looks again, a few times, rather than leaving the job
// to wait for a free slot.
func (c *queuedCancel) cancelQueued(ctx context.Context, ref protocol.QueryRef) (*protocol.StatusEvent, error) {
	for try := 0; try < 4; try++ {
		ended, drop, jobSeq, err := c.endQueued(ctx, ref)
		if err != nil {
			return nil, err
		}
		if ended {
			return c.dropEnded(ctx, ref, drop, jobSeq), nil
		}
		if drop == 0 {
			return nil, nil
		}
	}
	return nil, nil
}

// endQueued is one try of cancelQueued: it reports whether it ended ref,
// and the work queue's message to drop (0 when the query is not waiting:
// a try again would not end it) and the submission's sequence.
func (c *queuedCancel) endQueued(ctx context.Context, ref protocol.QueryRef) (bool, uint64, uint64, error) {
	n := c.names
	// From the stream's leader: the compare-and-sets below are against it.
	statusSeq, last, err := fence.LastStatus(ctx, c.nc, n.QueriesStream(), n.QueryStatus(ref.Tenant, ref.ID))
	if err != nil {
		return false, 0, 0, err
	}
	if last == nil || last.State != protocol.StateQueued || last.JobSeq == 0 {
		return false, 0, 0, nil // none (published straight to the queue), or not waiting
	}
	drop, err := c.undelivered(ctx, ref.Tenant, last.JobSeq)
	if err != nil || drop == 0 {
		return false, 0, 0, err // 0: a worker may have it
	}
	msg := "dispatcher: the query was cancelled while it was queued; it never started"
	ended, err := c.end.end(ctx, ending{
		tenant: ref.Tenant, id: ref.ID, attempt: 1, jobSeq: last.JobSeq,
		state: protocol.StateCancelled, reason: protocol.ReasonCancelled, code: protocol.CodeCancelled,
		message: msg, expectStatusSeq: statusSeq,
	})
	return ended, drop, last.JobSeq, err
}

// dropEnded takes the job of ref, which this dispatcher just ended, out of
// the work queue and returns ref's status.
func (c *queuedCancel) dropEnded(ctx context.Context, ref protocol.QueryRef, drop, jobSeq uint64) *protocol.StatusEvent {
	// Now that the query has ended, take the job out of the queue so no
	// worker is given it (one that still is sees the query finished).
	if err := c.dropJob(ctx, drop); err != nil {
		c.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("removing the cancelled job from the work queue")
	}
	c.log.Info().Str("tenant", ref.Tenant).Str("query_id", ref.ID).Uint64("job_seq", jobSeq).
		Msg("queued query cancelled and removed from the work queue")
	st, err := c.index.lookup(ctx, ref)
	if err != nil {
		return nil // the cancel is done; the reply just lacks the status
	}
	return st
}

// dropJob deletes job seq from the work queue; one already gone is fine.
func (c *queuedCancel) dropJob(ctx context.Context, seq uint64) error {
	jobs, err := c.js.Stream(ctx, c.names.JobsStream())
	if err != nil {
		return err
	}
	if err := jobs.DeleteMsg(ctx, seq); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil
		}
		return fmt.Errorf("removing job %d from the work queue: %w", seq, err)
	}
	return nil
}

// undelivered returns the stream sequence of submission jobSeq's job while
// no worker has been given it, else 0. Not admitted yet, the job is the
// submission itself, still on <prefix>.jobs.<tenant>. Admitted, it is the
// copy on <prefix>.work.<tenant> whose Fleet-Job-Seq is jobSeq; the work
// consumer hands jobs out in stream order, so a copy past the last
// sequence it delivered is still waiting.
func (c *queuedCancel) undelivered(ctx context.Context, tenant string, jobSeq uint64) (uint64, error) {
	n := c.names
	jobs, err := c.js.Stream(ctx, n.JobsStream())
	if err != nil {
		return 0, err
	}
	m, err := jobs.GetMsg(ctx, jobSeq)
	switch {
	case err == nil && m.Subject == n.JobSubject(tenant):
		return jobSeq, nil
	case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, err
	}
	// A tenant has at most the fleet's concurrency on its work subject.
	want := strconv.FormatUint(jobSeq, 10)
	var work uint64
	for from, i := jobSeq, 0; i < c.fleetCap+1; i++ {
		m, err := jobs.GetMsg(ctx, from, jetstream.WithGetMsgSubject(n.WorkSubject(tenant)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if m.Header.Get(protocol.HeaderJobSeq) == want {
			work = m.Sequence
			break
		}
		from = m.Sequence + 1
	}
	if work == 0 {
		return 0, nil
	}
	cons, err := c.js.Consumer(ctx, n.JobsStream(), n.Consumer())
	if err != nil {
		return 0, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.Delivered.Stream >= work {
		return 0, nil
	}
	return work, nil
}
