package worker

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// active is the worker's set of runs, by query: what the worker-wide .ctl
// subscription and the one heartbeat ticker act on (package doc, "One
// subscription and one ticker per worker").
type active struct {
	mu   sync.Mutex
	runs map[string][]*query // tenant/id → runs of that query on this worker
}

func activeKey(tenant, id string) string { return tenant + "/" + id }

// add registers q until the returned func is called.
func (a *active) add(q *query) (remove func()) {
	key := activeKey(q.job.Tenant, q.job.ID)
	a.mu.Lock()
	if a.runs == nil {
		a.runs = make(map[string][]*query)
	}
	a.runs[key] = append(a.runs[key], q)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		rs := a.runs[key]
		for i, r := range rs {
			if r == q {
				rs = append(rs[:i:i], rs[i+1:]...)
				break
			}
		}
		if len(rs) == 0 {
			delete(a.runs, key)
		} else {
			a.runs[key] = rs
		}
	}
}

// of returns the runs of one query.
func (a *active) of(tenant, id string) []*query {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*query(nil), a.runs[activeKey(tenant, id)]...)
}

// all returns every run.
func (a *active) all() []*query {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*query
	for _, rs := range a.runs {
		out = append(out, rs...)
	}
	return out
}

// trackRun records a job as running until the returned func is called.
func (w *Worker) trackRun(job *protocol.Job, attempt int) (untrack func()) {
	key := strings.Join([]string{job.Tenant, job.ID}, "/")
	w.runs.Store(key, protocol.RunningJob{Tenant: job.Tenant, ID: job.ID, Attempt: attempt, Since: time.Now().UTC()})
	return func() { w.runs.Delete(key) }
}

// subscribeCtl subscribes once, for the worker's life, to the .ctl subjects
// of every query, and hands a cancel to the runs of its query on this
// worker (none: it is ignored). One subscription instead of a SUB and an
// UNSUB per job; a run registers before it reads the .ctl history, so a
// cancel is either in that history or delivered here while it is
// registered.
func (w *Worker) subscribeCtl() (*nats.Subscription, error) {
	return w.cfg.NC.Subscribe(w.names.CtlWildcard(), func(m *nats.Msg) {
		tenant, id, _, ok := w.names.ParseQuerySubject(m.Subject)
		if !ok {
			return
		}
		runs := w.active.of(tenant, id)
		if len(runs) == 0 {
			return
		}
		var op protocol.CtlOp
		if err := json.Unmarshal(m.Data, &op); err != nil || op.Op != protocol.OpCancel {
			return
		}
		for _, q := range runs {
			q.log.Info().Msg("cancel requested")
			q.cancelRun(agent.ErrCancelled)
		}
	})
}

// heartbeats is the worker's one heartbeat ticker: every interval it sends
// InProgress for every run's job message, and rechecks the fence of runs
// that have been going for a whole interval (a later attempt's claim stops
// a run at its next line or status anyway; the recheck bounds how long a
// silent agent of a superseded attempt keeps running). It returns when ctx
// ends, after the rechecks it started.
func (w *Worker) heartbeats(ctx context.Context) {
	var checks sync.WaitGroup
	defer checks.Wait()
	every := w.hb.interval()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.hb.reset:
			// The consumer's AckWait is known now (or changed).
			if e := w.hb.interval(); e != every {
				every = e
				t.Reset(every)
			}
			continue
		case <-t.C:
		}
		now := time.Now()
		for _, q := range w.active.all() {
			if err := q.msg.InProgress(); err != nil {
				q.log.Warn().Err(err).Msg("heartbeat failed")
			}
			// claimed first: it orders the read of q.fw after claim's write.
			if !q.claimed.Load() || q.fw == nil || q.fenced.is() || now.Sub(q.since) < every {
				continue
			}
			if !q.rechecking.CompareAndSwap(false, true) {
				continue // the previous recheck is still waiting for the stream
			}
			checks.Go(func() {
				defer q.rechecking.Store(false)
				rctx, cancel := context.WithTimeout(ctx, w.cfg.PublishTimeout)
				v, err := q.fw.Recheck(rctx)
				cancel()
				if err == nil && v != fence.Proceed {
					q.log.Warn().Str("verdict", v.String()).Msg("a later attempt or another writer owns the query; stopping this run")
					q.fenced.set(v)
					q.cancelRun(agent.ErrHandback)
				}
			})
		}
	}
}

// heartbeat is the state of the worker's one heartbeat ticker.
type heartbeat struct {
	every   time.Duration // Config.Heartbeat
	ackWait atomic.Int64  // the work consumer's AckWait
	reset   chan struct{} // AckWait changed
	stop    context.CancelFunc
	done    chan struct{}
}

// interval is the InProgress interval: Config.Heartbeat, else a third of
// the consumer's AckWait (once known).
func (h *heartbeat) interval() time.Duration {
	if h.every > 0 {
		return h.every
	}
	if aw := time.Duration(h.ackWait.Load()); aw > 0 {
		return max(aw/3, 100*time.Millisecond)
	}
	return 10 * time.Second
}

// setAckWait records the work consumer's AckWait for the ticker.
func (h *heartbeat) setAckWait(d time.Duration) {
	if old := h.ackWait.Swap(int64(d)); old != int64(d) {
		select {
		case h.reset <- struct{}{}:
		default:
		}
	}
}

// runFlags are a query's fields for the heartbeat ticker.
type runFlags struct {
	since      time.Time
	claimed    atomic.Bool // its first status is stored (the fence is its own)
	rechecking atomic.Bool
	// running is whether this attempt's last stored status is "running"
	// (published, see markPublished): a session's turn that starts right
	// after it announces nothing more (one "running" per turn start).
	running atomic.Bool
}

// markPublished records the state of a status this attempt stored.
func (f *runFlags) markPublished(s protocol.State) { f.running.Store(s == protocol.StateRunning) }
