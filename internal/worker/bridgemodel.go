package worker

// The model metering of a run in a Cloudflare sandbox (docs/gateway.md): the
// sandbox cannot reach the worker's gateway, so the bridge Worker meters
// at its egress with the same rules and holds the credential (a bridge
// secret). The worker opens the run on the bridge with the query's call
// numbering, its cap and earlier spend, reads the metered calls while the
// run goes on and publishes each as a .model event exactly as the gateway's
// JetStreamPublisher does, ends the run failed / budget once the bridge
// reports the cap reached, and closes the run at the end.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// bridgeModelPoll is how often the bridge's record of a run is read.
const bridgeModelPoll = 250 * time.Millisecond

// bridgeModelTimeout bounds opening and closing a run on the bridge.
const bridgeModelTimeout = 30 * time.Second

// bridgeMeteredMode runs its mode with a model run open on the bridge.
type bridgeMeteredMode struct {
	mode
	q *query

	mu sync.Mutex
	// earlier is the query's metered spend before this run; sum is this
	// run's (calls read, their cost, and the cap once reported).
	earlier float64
	sum     gateway.Summary
	opened  bool
	// cursor is the bridge's index of the next call to read.
	cursor int
	// limit is the cap sent to the bridge and why (0: none).
	limit  float64
	reason string
	// refused: the tenant's budget could not be read (failed / budget).
	refused bool
}

func (m *bridgeMeteredMode) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (agent.Outcome, error) {
	mm, ok := sb.(sandbox.ModelMetered)
	if !ok { // a sandbox that could not be made: the run ends without a call
		return m.mode.run(ctx, sb, emit)
	}
	q := m.q
	w, job := q.w, q.job
	hctx, cancel := context.WithTimeout(ctx, modelHistoryTimeout)
	stored, last, spent, err := modelHistory(hctx, w.js, w.names, job.Tenant, job.ID)
	cancel()
	if err != nil {
		return stoppedOr(ctx, emit, fmt.Errorf("reading the query's model calls: %w", err))
	}
	m.earlier = spent
	run := sandbox.ModelRun{Tenant: job.Tenant, QueryID: job.ID, Attempt: q.attempt, FirstCall: last + 1, SpentUSD: spent}
	m.limit, m.reason, err = m.capOf(spent)
	if err != nil {
		m.refused = true
		return stoppedOr(ctx, emit, err, budgetUnread)
	}
	run.MaxCostUSD = m.limit
	octx, cancel := context.WithTimeout(ctx, bridgeModelTimeout)
	err = mm.OpenModelRun(octx, run)
	cancel()
	if err != nil {
		return stoppedOr(ctx, emit, fmt.Errorf("opening the model run on the bridge: %w", err))
	}
	m.opened = true

	pctx, stop := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		m.poll(pctx, mm)
	}()
	out, runErr := m.mode.run(ctx, sb, emit)
	stop()
	<-polled

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bridgeModelTimeout)
	defer cancel()
	rep, err := mm.CloseModelRun(cctx, m.cursor)
	if err != nil {
		q.log.Warn().Err(err).Msg("closing the model run on the bridge; its last calls may be unreported")
	} else {
		m.take(rep)
	}
	if n := m.calls(); n > 0 {
		if err := waitModelEvents(cctx, w.js, w.names, job.Tenant, job.ID, stored+n); err != nil {
			q.log.Warn().Err(err).Msg("the run's model events are not all stored yet")
		}
	}
	return out, runErr
}

// stoppedOr is how a run that failed before its agent started ends: as
// what stopped it (a hand-back, a cancel, a timeout), else with err, or
// as end(err) says when given.
func stoppedOr(ctx context.Context, emit agent.EmitFunc, err error, end ...func(agent.EmitFunc, error) (agent.Outcome, error)) (agent.Outcome, error) {
	if c := stopCause(ctx); c != nil {
		if errors.Is(c, agent.ErrHandback) {
			return agent.Outcome{HandedBack: true}, nil
		}
		reason, msg := agent.ReasonFor(c)
		return syntheticEnd(emit, reason, msg)
	}
	if len(end) > 0 {
		return end[0](emit, err)
	}
	return agent.Outcome{}, err
}

// capOf is the cap of a run whose query spent spent so far: the job's
// max_cost_usd, or what is left of the tenant's budget when that is less
// (read once, when the run opens, as for a local run).
func (m *bridgeMeteredMode) capOf(spent float64) (float64, string, error) {
	w, job := m.q.w, m.q.job
	limit, reason := 0.0, ""
	if job.MaxCostUSD != nil {
		limit, reason = *job.MaxCostUSD, gateway.CapMaxCost
	}
	if w.cfg.TenantBudget != nil {
		budget, err := w.cfg.TenantBudget(job.Tenant)
		if err != nil {
			return 0, "", err
		}
		if budget != nil {
			if rem, limited := budget(); limited {
				// The bridge takes a cap above 0: a spent budget stops the first call.
				t := math.Max(spent+math.Max(rem, 0), math.SmallestNonzeroFloat64)
				if limit == 0 || t < limit {
					limit, reason = t, gateway.CapTenantBudget
				}
			}
		}
	}
	return limit, reason, nil
}

// poll reads the run's calls until ctx ends; a failed read is tried again
// at the next tick (the first of a streak of failures is logged).
func (m *bridgeMeteredMode) poll(ctx context.Context, mm sandbox.ModelMetered) {
	t := time.NewTicker(bridgeModelPoll)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep, err := mm.ModelCalls(ctx, m.cursor)
		if err != nil {
			if ctx.Err() == nil && !failing {
				m.q.log.Warn().Err(err).Msg("reading the run's model calls from the bridge; retrying")
			}
			failing = true
			continue
		}
		failing = false
		m.take(rep)
	}
}

// take publishes a report's calls on .model and, the first time the bridge
// reports the cap reached, stops the run with the budget cause.
func (m *bridgeMeteredMode) take(rep sandbox.ModelReport) {
	q := m.q
	pub := gateway.JetStreamPublisher{JS: q.w.js, Names: q.w.names, Logger: &q.log}
	info := gateway.RunInfo{Tenant: q.job.Tenant, QueryID: q.job.ID, Attempt: q.attempt}
	for _, c := range rep.Calls {
		pub.PublishModel(info, c)
	}
	m.mu.Lock()
	m.cursor = rep.Next
	m.sum.Calls += len(rep.Calls)
	m.sum.CostUSD = rep.SpentUSD - m.earlier
	var capped *gateway.Cap
	if rep.Capped && m.sum.Capped == nil {
		capped = &gateway.Cap{Reason: m.reason, SpentUSD: rep.SpentUSD, LimitUSD: m.limit}
		if m.reason == gateway.CapTenantBudget {
			capped.SpentUSD, capped.LimitUSD = rep.SpentUSD-m.earlier, m.limit-m.earlier
		}
		m.sum.Capped = capped
	}
	m.mu.Unlock()
	if capped != nil {
		q.cancelRun(errBudget{*capped})
	}
}

func (m *bridgeMeteredMode) calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sum.Calls
}

// finish is meteredMode's: the metered spend is the terminal status's
// total_cost_usd, and a cap ends the run failed / budget.
func (m *bridgeMeteredMode) finish(ctx context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	ev = m.mode.finish(ctx, ev)
	m.mu.Lock()
	sum := m.sum
	m.mu.Unlock()
	return refusedStatus(m.refused, meteredStatus(m.q, ev, m.opened, m.earlier, sum))
}
