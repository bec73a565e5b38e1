package fleetapi

import (
	"context"
	"fmt"
	"strings"
)

// QueueInfo is where a queued job stands.
type QueueInfo struct {
	// Position is the job's place among the jobs no worker has taken yet
	// (1: the next one taken); 0 when it has been taken or is not known.
	Position uint64
	// Pending counts the jobs no worker has taken yet, fleet-wide.
	Pending uint64
	// Waiting counts workers' open pull requests: free slots asking for
	// work right now.
	Waiting int
	// Workers counts the workers that answered discovery
	// ($SRV.PING.agentfleet-worker); -1 when not known.
	Workers int
}

// String says it for people: "2 workers connected (0 free slots asking
// for work), position 3 of 5".
func (q QueueInfo) String() string {
	var parts []string
	if q.Workers >= 0 {
		parts = append(parts, fmt.Sprintf("%d workers connected", q.Workers))
	}
	parts = append(parts, fmt.Sprintf("%d free slots asking for work", q.Waiting))
	if q.Position > 0 {
		parts = append(parts, fmt.Sprintf("position %d of %d", q.Position, q.Pending))
	}
	return strings.Join(parts, ", ")
}

// Queue tells where the job with FLEET_JOBS sequence jobSeq stands (0: the
// fleet's queue only). It reads the work consumer's info and counts the
// workers through discovery.
func (c *Client) Queue(ctx context.Context, jobSeq uint64) (QueueInfo, error) {
	q := QueueInfo{Workers: -1}
	cons, err := c.JS.Consumer(ctx, c.Names.JobsStream(), c.Names.Consumer())
	if err != nil {
		return q, fmt.Errorf("fleet: the work consumer: %w", err)
	}
	info := cons.CachedInfo()
	q.Pending, q.Waiting = info.NumPending, info.NumWaiting
	if jobSeq > info.Delivered.Stream {
		// Sequences between the last delivered job and this one: each is
		// a job ahead of it unless it was removed (cancelled, dead-lettered).
		q.Position = min(jobSeq-info.Delivered.Stream, max(q.Pending, 1))
	}
	if n, err := c.CountWorkers(ctx); err == nil {
		q.Workers = n
	}
	return q, nil
}
