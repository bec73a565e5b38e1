package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The pass: read the queue and the run counts, admit by deficit round
// robin what the policy allows, and remove what was admitted.

// passResult is what a pass saw and did.
type passResult struct {
	// fresh: the stream had stored something this leader had not seen.
	fresh bool
	// admitted: jobs moved to the work subjects.
	admitted int
	// held: jobs were left waiting (caps, budgets, pauses).
	held bool
}

// pass reads the queue and run counts from the stream and admits what the
// policy allows, then says why the rest waits.
func (a *Admitter) pass(ctx context.Context) (res passResult, err error) {
	n := a.names
	defer a.purgeMoved(ctx)
	info, err := a.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return res, fmt.Errorf("reading %s: %w", n.JobsStream(), err)
	}
	res.fresh = info.State.LastSeq > a.storedSeq
	a.storedSeq = max(a.storedSeq, info.State.LastSeq)
	queued, running := map[string]int{}, map[string]int{}
	total := 0
	jobsPrefix, workPrefix := n.Prefix()+".jobs.", n.Prefix()+".work."
	var invalid []string
	for subj, c := range info.State.Subjects {
		switch {
		case strings.HasPrefix(subj, workPrefix):
			total += int(c)
			if t, ok := n.ParseWorkSubject(subj); ok {
				running[t] += int(c)
			}
		case strings.HasPrefix(subj, jobsPrefix):
			t := subj[len(jobsPrefix):]
			if protocol.ValidTenant(t) {
				queued[t] += int(c)
			} else {
				invalid = append(invalid, subj)
			}
		}
	}
	// Jobs on a subject with no valid tenant pass unadmitted: the worker
	// rejects them as it always did.
	for _, subj := range invalid {
		for {
			moved, err := a.move(ctx, subj, subj[len(jobsPrefix):], n.Prefix()+".work."+subj[len(jobsPrefix):])
			if err != nil || !moved {
				break
			}
		}
	}
	for t, c := range queued {
		if c < a.lastQueue[t] {
			// Fewer queued than this admitter left: a job was removed
			// by someone else (the dispatcher's cancel of a queued
			// job). The cached heads may hold it: read them again, and
			// announce the new places now.
			delete(a.heads, t)
			delete(a.rounds, t)
		}
	}
	defer func() { a.lastQueue = queued }() // after this pass's moves
	now := a.cfg.Now()
	// The fleet's cap is the work consumer's MaxAckPending (the dispatcher
	// started last set it), not this dispatcher's flag.
	pol := a.cfg.Policy
	pol.FleetCap = a.FleetCap()
	active := make([]string, 0, len(queued))
	for t, c := range queued {
		if c > 0 {
			active = append(active, t)
		}
	}
	eligible := func(t string) bool {
		return queued[t] > 0 && pol.Decide(a.tenantState(t, running[t], now), total, now).Admit
	}
	weight := func(t string) float64 { return a.cfg.Policy.Effective(a.tenantState(t, 0, now).Settings).Weight }
	for total < pol.FleetCap && a.leaseValid() {
		t := a.sched.next(active, eligible, weight)
		if t == "" {
			break
		}
		moved, err := a.move(ctx, n.JobSubject(t), t, n.WorkSubject(t))
		if err != nil {
			return res, err
		}
		if !moved {
			queued[t] = 0
			continue
		}
		res.admitted++
		queued[t]--
		running[t]++
		total++
	}
	for t, c := range queued {
		if c <= 0 {
			delete(a.heads, t)
			continue
		}
		res.held = true
		if wall := time.Now(); wall.Sub(a.rounds[t]) >= announceEvery {
			a.rounds[t] = wall
			d := pol.Decide(a.tenantState(t, running[t], now), total, now)
			reason := cmp.Or(d.Reason, protocol.ReasonFleetCap)
			if err := a.announce(ctx, t, reason, min(c, a.cfg.Announce)); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// move admits the first job on subject from: it copies the job to the work
// subject to (Nats-Msg-Id "_admit.<seq>", so a copy made again after a
// failover is dropped as a duplicate); purgeMoved removes it from the
// queue at the end of the pass. It reports false when subject has no job.
func (a *Admitter) move(ctx context.Context, from, tenant, to string) (bool, error) {
	raw, err := a.stream.GetMsg(ctx, max(a.cursor[from], 1), jetstream.WithGetMsgSubject(from))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the next job of %s: %w", from, err)
	}
	wm := nats.NewMsg(to)
	wm.Data = raw.Data
	for k, v := range raw.Header {
		if !strings.HasPrefix(k, "Nats-") {
			wm.Header[k] = v
		}
	}
	seq := strconv.FormatUint(raw.Sequence, 10)
	wm.Header.Set(protocol.HeaderMsgID, "_admit."+seq)
	wm.Header.Set(protocol.HeaderJobSeq, seq)
	wm.Header.Set(protocol.HeaderQueuedAt, raw.Time.UTC().Format(time.RFC3339Nano))
	ack, err := a.cfg.JS.PublishMsg(ctx, wm)
	if err != nil {
		return false, fmt.Errorf("admitting job %s: %w", seq, err)
	}
	a.storedSeq = max(a.storedSeq, ack.Sequence) // our own copy is not news
	a.cursor[from] = raw.Sequence + 1
	a.moved[from] = true
	if h := a.heads[tenant]; len(h) > 0 && h[0].seq == raw.Sequence {
		a.heads[tenant] = h[1:]
	} else {
		delete(a.heads, tenant)
	}
	delete(a.announced, raw.Sequence)
	a.log.Debug().Str("tenant", tenant).Uint64("job_seq", raw.Sequence).Msg("admitted")
	return true, nil
}

// purgeMoved removes from the queue every job this leader admitted: one
// purge per subject, up to its cursor. Jobs leave a subject in order, so
// everything on it below the cursor was admitted (one delete per job
// cost a JSON API call each). A subject whose purge fails is tried again
// after the next pass; meanwhile the cursor keeps its jobs from being
// admitted twice, and a new leader's copies are dropped as duplicates.
func (a *Admitter) purgeMoved(ctx context.Context) {
	for subj := range a.moved {
		err := a.stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(a.cursor[subj]))
		if err != nil {
			a.log.Warn().Err(err).Str("subject", subj).Msg("removing admitted jobs from the queue; will retry")
			continue
		}
		delete(a.moved, subj)
	}
}
