package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Leadership and the lease: one admitter holds the lease and admits.

const leaderKey = "leader"

// campaign tries to take the leadership lease and admits while it holds it.
func (a *Admitter) campaign(ctx context.Context) {
	defer a.wg.Done()
	retry := a.cfg.LeaseTTL / 5
	for ctx.Err() == nil {
		at := time.Now()
		rev, err := a.lease.Create(ctx, leaderKey, []byte(a.cfg.ID))
		if errors.Is(err, jetstream.ErrKeyExists) {
			// Still ours (a renewal failed during a server failover, say):
			// take it back with a renewal rather than wait for it to expire.
			if e, gerr := a.lease.Get(ctx, leaderKey); gerr == nil && string(e.Value()) == a.cfg.ID {
				at = time.Now()
				rev, err = a.lease.Update(ctx, leaderKey, []byte(a.cfg.ID), e.Revision())
			}
		}
		if err == nil {
			a.lead(ctx, rev, at)
			continue
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("taking the admitter lease")
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// lead admits until the lease is lost or the admitter stops: it keeps
// the lease renewed and the fleet's cap read (goroutines of their own, so
// a slow read never delays a renewal), listens for wake-ups, and runs
// passes of one term of leadership.
func (a *Admitter) lead(ctx context.Context, rev uint64, at time.Time) {
	lctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	// Admit only within half the TTL of the last renewal (from when it was
	// sent): another dispatcher can take the lease only a whole TTL after.
	a.validUntil.Store(at.Add(a.cfg.LeaseTTL / 2).UnixNano())
	defer a.leading.Store(false)
	var rwg sync.WaitGroup
	rwg.Go(func() { a.followFleetCap(lctx) })
	rwg.Go(func() { rev = a.renew(lctx, lost, rev) })
	subs := a.listen(lost)
	// Leading once it listens: what reads Leading (tests, Admitting)
	// sees every subscription the leader makes already made.
	a.leading.Store(true)
	a.log.Info().Msg("admitting: this dispatcher holds the admitter lease")
	newTerm(a).run(lctx)
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	lost(nil)
	rwg.Wait()
	if errors.Is(context.Cause(ctx), errStopping) {
		// Hand the lease over at once.
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = a.lease.Delete(dctx, leaderKey, jetstream.LastRevision(rev))
		cancel()
	}
	a.log.Info().Msg("no longer admitting")
}

// followFleetCap reads the fleet's cap every lease TTL while leading;
// until the first read, passes use this dispatcher's own cap.
func (a *Admitter) followFleetCap(ctx context.Context) {
	t := time.NewTicker(a.cfg.LeaseTTL)
	defer t.Stop()
	for {
		a.readFleetCap(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// renew renews the lease every LeaseTTL/5 and moves the admitting
// deadline on; a renewal that fails ends the term (lost). It returns the
// lease's last revision.
func (a *Admitter) renew(ctx context.Context, lost context.CancelCauseFunc, rev uint64) uint64 {
	ttl := a.cfg.LeaseTTL
	t := time.NewTicker(ttl / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return rev
		case <-t.C:
		}
		at := time.Now()
		rctx, cancel := context.WithTimeout(ctx, ttl/3)
		r, err := a.lease.Update(rctx, leaderKey, []byte(a.cfg.ID), rev)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn().Err(err).Msg("renewing the admitter lease failed; stopping admission")
				lost(err)
			}
			return rev
		}
		rev = r
		a.validUntil.Store(at.Add(ttl / 2).UnixNano())
	}
}

// listen subscribes the leader to its wake-ups: jobs published, runs
// ended, and forwarded lines that may report a rate limit. A subscription
// that fails ends the term (lost).
func (a *Admitter) listen(lost context.CancelCauseFunc) []*nats.Subscription {
	n := a.names
	var subs []*nats.Subscription
	for subj, h := range map[string]nats.MsgHandler{
		n.JobsWildcard(): func(*nats.Msg) { a.jobPokes.Add(1); a.poke() },
		n.StatusWildcard(): func(m *nats.Msg) {
			// Only a run's end changes what a pass sees (a slot, a
			// tenant's spend); "running" and the like do not, and a pass
			// for each of them only read the queue again.
			if st, _ := statusState(m.Data); st.Terminal() || st == protocol.StateParked {
				if st.Terminal() {
					a.book.seenCost(m.Data) // as RecordSpend: terminal results only
				}
				a.endPokes.Add(1)
				a.poke()
			}
		},
		n.RateLimitWildcard(): a.onLine,
	} {
		s, err := a.cfg.NC.Subscribe(subj, h)
		if err != nil {
			a.log.Error().Err(err).Str("subject", subj).Msg("subscribing")
			lost(err)
			break
		}
		subs = append(subs, s)
	}
	return subs
}

func (a *Admitter) leaseValid() bool { return time.Now().UnixNano() < a.validUntil.Load() }

// FleetCap is the fleet's cap a pass admits up to: the work consumer's
// MaxAckPending, which is what workers are held to, once read while
// leading; until then Policy.FleetCap (this dispatcher's --max-concurrency).
func (a *Admitter) FleetCap() int {
	if c := a.workCap.Load(); c > 0 {
		return int(c)
	}
	return a.cfg.Policy.FleetCap
}

// readFleetCap reads the work consumer's MaxAckPending. Every dispatcher
// sets it when it starts (--max-concurrency), so one started with another
// value changes it for the whole fleet; the leader follows it, and says so
// when it differs from its own flag, instead of admitting jobs that wait
// on the work subjects with no reason given.
func (a *Admitter) readFleetCap(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := a.stream.Consumer(rctx, a.names.Consumer())
	if err != nil {
		return // kept as it was; read again a lease TTL later
	}
	n := int64(c.CachedInfo().Config.MaxAckPending)
	if n <= 0 {
		return
	}
	if old := a.workCap.Swap(n); old != n && int(n) != a.cfg.Policy.FleetCap {
		a.log.Warn().Int64("work_consumer_max_ack_pending", n).Int("max_concurrency", a.cfg.Policy.FleetCap).
			Msg("the fleet's cap is the work consumer's MaxAckPending, which another dispatcher's --max-concurrency set; admitting up to it (start every dispatcher with the same --max-concurrency)")
	}
}
