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

// term is one term of leadership: the leader's state between passes,
// used by the lead goroutine alone, and forgotten when the lease goes.
type term struct {
	a         *Admitter
	sched     *drr
	cursor    map[string]uint64
	moved     map[string]bool // subjects with admitted jobs not yet purged
	storedSeq uint64          // highest FLEET_JOBS sequence known stored
	lastQueue map[string]int  // per tenant: its queued jobs after the last pass
	places    *places
}

func newTerm(a *Admitter) *term {
	return &term{a: a, sched: newDRR(), cursor: map[string]uint64{}, moved: map[string]bool{}, places: newPlaces()}
}

// run passes until ctx ends: at every wake-up, every Config.Tick, and
// soon again after a wake-up whose pass could not see its cause yet.
//
// A job's core message (the wake-up) can arrive before the stream has
// stored the job: a pass then finds nothing new, and the job would wait
// for the tick. So after a wake-up from a job, a pass that saw nothing
// stored since the last one looks again soon, backing off (1ms, doubling,
// up to 64ms; then the tick). A job dropped as a duplicate costs those
// few passes.
//
// Likewise a run's end: its worker publishes the terminal (or parked)
// status before it acks the work message, and the ack is what frees the
// slot the pass counts. So after a wake-up from a run's end, a pass that
// left jobs waiting and admitted none looks again the same way, but
// backing off up to the tick or 2s, whichever is less: a worker on a busy
// host can take longer than 64ms between the two, and with a long tick
// the job would wait for it.
func (tm *term) run(ctx context.Context) {
	a := tm.a
	tick := time.NewTicker(a.cfg.Tick)
	defer tick.Stop()
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	var (
		seenPokes, seenEnds int64
		announced           bool // a job was announced that no pass has seen stored
		ending              bool // a run ended that no pass has seen free its slot
		backoff             time.Duration
	)
	for ctx.Err() == nil {
		pokes, ends := a.jobPokes.Load(), a.endPokes.Load()
		announced = announced || pokes != seenPokes
		ending = ending || ends != seenEnds
		seenPokes, seenEnds = pokes, ends
		res, err := tm.pass(ctx)
		if err != nil && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("admission pass failed; retrying")
		}
		if res.fresh {
			announced = false
		}
		if res.admitted > 0 || !res.held {
			ending = false
		}
		var again <-chan time.Time
		switch {
		case err != nil || (!announced && !ending):
			announced, ending, backoff = false, false, 0
		case backoff >= 64*time.Millisecond && (!ending || backoff >= min(a.cfg.Tick, 2*time.Second)):
			announced, ending, backoff = false, false, 0 // the tick looks again
		default:
			backoff = max(2*backoff, time.Millisecond)
			recheck.Reset(backoff)
			again = recheck.C
		}
		select {
		case <-ctx.Done():
		case <-a.wake:
		case <-tick.C:
		case <-again:
		}
	}
}

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
func (tm *term) pass(ctx context.Context) (res passResult, err error) {
	n := tm.a.names
	defer tm.purgeMoved(ctx)
	info, err := tm.a.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return res, fmt.Errorf("reading %s: %w", n.JobsStream(), err)
	}
	res.fresh = info.State.LastSeq > tm.storedSeq
	tm.storedSeq = max(tm.storedSeq, info.State.LastSeq)
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
			moved, err := tm.move(ctx, subj, subj[len(jobsPrefix):], n.Prefix()+".work."+subj[len(jobsPrefix):])
			if err != nil || !moved {
				break
			}
		}
	}
	for t, c := range queued {
		if c < tm.lastQueue[t] {
			// Fewer queued than this admitter left: a job was removed
			// by someone else (the dispatcher's cancel of a queued
			// job). The cached heads may hold it: read them again, and
			// announce the new places now.
			tm.places.forget(t)
		}
	}
	defer func() { tm.lastQueue = queued }() // after this pass's moves
	now := tm.a.cfg.Now()
	// The fleet's cap is the work consumer's MaxAckPending (the dispatcher
	// started last set it), not this dispatcher's flag.
	pol := tm.a.cfg.Policy
	pol.FleetCap = tm.a.FleetCap()
	active := make([]string, 0, len(queued))
	for t, c := range queued {
		if c > 0 {
			active = append(active, t)
		}
	}
	eligible := func(t string) bool {
		return queued[t] > 0 && pol.Decide(tm.a.book.tenant(t, running[t], now), total, now).Admit
	}
	weight := func(t string) float64 { return tm.a.cfg.Policy.Effective(tm.a.book.tenant(t, 0, now).Settings).Weight }
	for total < pol.FleetCap && tm.a.leaseValid() {
		t := tm.sched.next(active, eligible, weight)
		if t == "" {
			break
		}
		moved, err := tm.move(ctx, n.JobSubject(t), t, n.WorkSubject(t))
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
			delete(tm.places.heads, t)
			continue
		}
		res.held = true
		if wall := time.Now(); wall.Sub(tm.places.rounds[t]) >= announceEvery {
			tm.places.rounds[t] = wall
			d := pol.Decide(tm.a.book.tenant(t, running[t], now), total, now)
			reason := cmp.Or(d.Reason, protocol.ReasonFleetCap)
			if err := tm.announce(ctx, t, reason, min(c, tm.a.cfg.Announce)); err != nil {
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
func (tm *term) move(ctx context.Context, from, tenant, to string) (bool, error) {
	raw, err := tm.a.stream.GetMsg(ctx, max(tm.cursor[from], 1), jetstream.WithGetMsgSubject(from))
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
	wm.Header.Set(protocol.HeaderSubject, raw.Subject)
	wm.Header.Set(protocol.HeaderQueuedAt, raw.Time.UTC().Format(time.RFC3339Nano))
	ack, err := tm.a.cfg.JS.PublishMsg(ctx, wm)
	if err != nil {
		return false, fmt.Errorf("admitting job %s: %w", seq, err)
	}
	tm.storedSeq = max(tm.storedSeq, ack.Sequence) // our own copy is not news
	tm.cursor[from] = raw.Sequence + 1
	tm.moved[from] = true
	tm.a.traceAdmit(raw.Header, tenant, raw.Time, tm.places.announced[raw.Sequence].reason)
	tm.places.admitted(tenant, raw.Sequence)
	tm.a.log.Debug().Str("tenant", tenant).Uint64("job_seq", raw.Sequence).Msg("admitted")
	return true, nil
}

// purgeMoved removes from the queue every job this leader admitted: one
// purge per subject, up to its cursor. Jobs leave a subject in order, so
// everything on it below the cursor was admitted (one delete per job
// cost a JSON API call each). A subject whose purge fails is tried again
// after the next pass; meanwhile the cursor keeps its jobs from being
// admitted twice, and a new leader's copies are dropped as duplicates.
func (tm *term) purgeMoved(ctx context.Context) {
	for subj := range tm.moved {
		err := tm.a.stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(tm.cursor[subj]))
		if err != nil {
			tm.a.log.Warn().Err(err).Str("subject", subj).Msg("removing admitted jobs from the queue; will retry")
			continue
		}
		delete(tm.moved, subj)
	}
}
