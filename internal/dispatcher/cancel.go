package dispatcher

// A cancel of a query still waiting in the work queue ends it at once
// (issue 8.6), instead of leaving it "queued" until a worker frees a slot,
// takes the job and only then sees the cancel.

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// cancelQueued ends ref now if its last status is the "queued" of a
// submission no worker has been given yet: it writes the synthetic result
// and the cancelled status (attempt 1, as a worker would for a job
// cancelled before it started), both compare-and-sets against that
// "queued" status, then removes the job from the work queue so no worker
// is given it. It returns the status it wrote, or nil when a worker may
// already have the job (it has the cancel on record and ends the run
// itself) or the query is not queued.
//
// "Not given to a worker yet" is read from the work consumer: it hands out
// jobs in stream order, so a job whose stream sequence is past the last one
// it delivered is still waiting. A worker given the job in the moment
// between that look and the delete finds the cancel on record; if its first
// status lands before the dispatcher's compare-and-sets, the dispatcher
// writes nothing; if it comes after them, the worker's claim (itself a
// compare-and-set, internal/fence) reads the terminal status of the same
// submission and acks the job without running it. Either way the query has
// one terminal status.
func (s *Service) cancelQueued(ctx context.Context, ref protocol.QueryRef) (*protocol.StatusEvent, error) {
	n := s.names
	// From the stream's leader: the compare-and-sets below are against it.
	statusSeq, last, err := fence.LastStatus(ctx, s.cfg.NC, n.QueriesStream(), n.QueryStatus(ref.Tenant, ref.ID))
	if err != nil {
		return nil, err
	}
	if last == nil || last.State != protocol.StateQueued || last.JobSeq == 0 {
		return nil, nil // none (published straight to the queue), or not waiting
	}
	cons, err := s.js.Consumer(ctx, n.JobsStream(), n.Consumer())
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Delivered.Stream >= last.JobSeq {
		return nil, nil // a worker may have it
	}
	msg := "dispatcher: the query was cancelled while it was queued; it never started"
	ended, err := s.end(ctx, ending{
		tenant: ref.Tenant, id: ref.ID, attempt: 1, jobSeq: last.JobSeq,
		state: protocol.StateCancelled, reason: protocol.ReasonCancelled, code: protocol.CodeCancelled,
		message: msg, expectStatusSeq: statusSeq,
	})
	if err != nil || !ended {
		return nil, err
	}
	// Now that the query has ended, take the job out of the queue so no
	// worker is given it (one that still is sees the query finished).
	if err := s.dropJob(ctx, last.JobSeq); err != nil {
		s.log.Warn().Err(err).Str("tenant", ref.Tenant).Str("query_id", ref.ID).Msg("removing the cancelled job from the work queue")
	}
	s.log.Info().Str("tenant", ref.Tenant).Str("query_id", ref.ID).Uint64("job_seq", last.JobSeq).
		Msg("queued query cancelled and removed from the work queue")
	st, err := s.lookup(ctx, ref)
	if err != nil {
		return nil, nil //nolint:nilerr // the cancel is done; the reply just lacks the status
	}
	return st, nil
}

// dropJob deletes job seq from the work queue; one already gone is fine.
func (s *Service) dropJob(ctx context.Context, seq uint64) error {
	jobs, err := s.js.Stream(ctx, s.names.JobsStream())
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
