package worker

// The model gateway's hooks in a run (docs/gateway.md): a metered mode opens a
// gateway token for the run, gives the agent the gateway's URL and the
// token instead of any credential, closes the token when the run ends or
// its session parks, and makes the terminal status say the metered spend
// (and budget, when a cap stopped the run).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// Variables the worker sets in the agent's environment for the gateway.
const (
	envBaseURL      = "ANTHROPIC_BASE_URL"
	envAPIKey       = "ANTHROPIC_API_KEY"
	envNonessential = "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"
)

// ReservedModelEnv reports whether a job or an operator's allow-list may
// not set name: the model credential variables and ANTHROPIC_BASE_URL are
// the worker's (the gateway's URL and the run's token), never a job's.
func ReservedModelEnv(name string) bool {
	return gateway.IsCredentialEnv(name) || name == envBaseURL
}

// errBudget is the cause a run is cancelled with when the gateway's cap
// stops it.
type errBudget struct{ cap gateway.Cap }

func (e errBudget) Error() string { return "worker: " + e.cap.Message() }

// meteredMode runs its mode with a gateway token: the agent's environment
// (env, shared with the mode) gets the gateway's URL and the token.
type meteredMode struct {
	mode
	q   *query
	env map[string]string
	// earlier is the query's metered spend before this run (earlier
	// attempts and jobs of a session); sum is this run's, once closed.
	earlier float64
	sum     gateway.Summary
	opened  bool
	// refused: the tenant's budget could not be read, so the agent did
	// not start (failed / budget).
	refused bool
}

// modelHistoryTimeout bounds reading the query's earlier .model events.
const modelHistoryTimeout = 10 * time.Second

func (m *meteredMode) run(ctx context.Context, sb sandbox.Sandbox, emit agent.EmitFunc) (agent.Outcome, error) {
	q := m.q
	w, job := q.w, q.job
	hctx, cancel := context.WithTimeout(ctx, modelHistoryTimeout)
	stored, last, spent, err := modelHistory(hctx, w.js, w.names, job.Tenant, job.ID)
	cancel()
	if err != nil {
		if c := stopCause(ctx); c != nil {
			if errors.Is(c, agent.ErrHandback) {
				return agent.Outcome{HandedBack: true}, nil
			}
			reason, msg := agent.ReasonFor(c)
			return syntheticEnd(emit, reason, msg)
		}
		return agent.Outcome{}, fmt.Errorf("reading the query's model calls: %w", err)
	}
	m.earlier = spent
	info := gateway.RunInfo{Tenant: job.Tenant, QueryID: job.ID, Attempt: q.attempt, FirstCall: last + 1, SpentUSD: spent,
		OnCap: func(c gateway.Cap) { q.cancelRun(errBudget{c}) }}
	info.Traceparent, info.Tracestate = tracing.Inject(ctx)
	if job.MaxCostUSD != nil {
		info.MaxCostUSD = *job.MaxCostUSD
	}
	if w.cfg.TenantBudget != nil {
		budget, err := w.cfg.TenantBudget(job.Tenant)
		if err != nil {
			m.refused = true
			return stoppedOr(ctx, emit, err, budgetUnread)
		}
		info.TenantBudget = budget
	}
	token, url := q.warmToken(), w.cfg.Gateway.URL()
	if token != "" {
		// A warm agent holds a token minted unbound at its spawn: it
		// becomes this run's before the agent gets its first message.
		if err := w.cfg.Gateway.Bind(token, info); err != nil {
			return agent.Outcome{}, fmt.Errorf("binding the warm agent's gateway token: %w", err)
		}
	} else {
		token, url = w.cfg.Gateway.Open(info)
	}
	m.opened = true
	// Contained, the agent reaches the gateway through the model forward.
	m.env[envBaseURL], m.env[envAPIKey], m.env[envNonessential] = q.agentModelURL(url), token, "1"
	out, runErr := m.mode.run(ctx, sb, emit)
	m.sum = w.cfg.Gateway.Close(token)
	delete(m.env, envAPIKey)
	if m.sum.Calls > 0 {
		// The events go out asynchronously: the status that reports
		// their sum follows them, and the next run numbers on from them.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), modelHistoryTimeout)
		if err := waitModelEvents(wctx, w.js, w.names, job.Tenant, job.ID, stored+m.sum.Calls); err != nil {
			q.log.Warn().Err(err).Msg("the run's model events are not all stored yet")
		}
		cancel()
	}
	return out, runErr
}

// finish reports the metered spend as the terminal status's
// total_cost_usd (the query's, earlier attempts and jobs included), and a
// run stopped at a cap as failed / budget. A parked status carries no cost
// (admission counts terminal ones).
func (m *meteredMode) finish(ctx context.Context, ev protocol.StatusEvent) protocol.StatusEvent {
	return refusedStatus(m.refused, meteredStatus(m.q, m.mode.finish(ctx, ev), m.opened, m.earlier, m.sum))
}

// refusedStatus gives a run refused for an unreadable budget its code.
func refusedStatus(refused bool, ev protocol.StatusEvent) protocol.StatusEvent {
	if refused && ev.Error != nil {
		ev.Error.Code = protocol.CodeBudget
	}
	return ev
}

// meteredStatus makes a terminal status say the metered spend (earlier
// plus the run's sum) and a cap's failed / budget.
func meteredStatus(q *query, ev protocol.StatusEvent, opened bool, earlier float64, sum gateway.Summary) protocol.StatusEvent {
	if !opened || !ev.State.Terminal() || ev.Result == nil {
		return ev
	}
	ev.Result.TotalCostUSD = earlier + sum.CostUSD
	// A cap ends the run failed / budget, unless a cancel stopped it first.
	if c := sum.Capped; c != nil && !errors.Is(context.Cause(q.runCtx), agent.ErrCancelled) {
		ev.State = protocol.StateFailed
		ev.Result.IsError = true
		ev.Error = &protocol.ErrorInfo{Code: protocol.CodeBudget, Message: c.Message()}
	}
	return ev
}

// modelHistory reads a query's stored .model events: how many, the last
// call's number and the sum of their costs.
func modelHistory(ctx context.Context, js jetstream.JetStream, names protocol.Names, tenant, id string) (n, last int, spent float64, err error) {
	subj := names.QueryModel(tenant, id)
	s, n, err := modelCount(ctx, js, names, subj)
	if err != nil || n == 0 {
		return 0, 0, 0, err
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}, InactiveThreshold: jsconsumer.InactiveThreshold})
	if err != nil {
		return 0, 0, 0, err
	}
	defer jsconsumer.Release(js, names.QueriesStream(), cons)
	for got := 0; got < n; {
		batch, err := cons.Fetch(n-got, jetstream.FetchMaxWait(modelHistoryTimeout/2))
		if err != nil {
			return 0, 0, 0, err
		}
		k := 0
		for msg := range batch.Messages() {
			k++
			ev, err := gateway.DecodeEvent(msg.Data())
			if err != nil {
				continue // not the gateway's: counts nothing
			}
			last, spent = max(last, ev.Call), spent+ev.CostUSD
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return 0, 0, 0, err
		}
		if k == 0 {
			return 0, 0, 0, fmt.Errorf("%d of %d model events of the query could not be read", n-got, n)
		}
		got += k
	}
	return n, last, spent, nil
}

// modelCount is how many messages the stream holds on subj.
func modelCount(ctx context.Context, js jetstream.JetStream, names protocol.Names, subj string) (jetstream.Stream, int, error) {
	s, err := js.Stream(ctx, names.QueriesStream())
	if err != nil {
		return nil, 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return nil, 0, err
	}
	return s, int(info.State.Subjects[subj]), nil
}

// waitModelEvents waits until the stream holds want .model events of the
// query (they are published asynchronously, and concurrent calls may be
// stored out of their numbers' order, so they are counted).
func waitModelEvents(ctx context.Context, js jetstream.JetStream, names protocol.Names, tenant, id string, want int) error {
	subj := names.QueryModel(tenant, id)
	backoff := 5 * time.Millisecond
	for {
		_, n, err := modelCount(ctx, js, names, subj)
		if err == nil && n >= want {
			return nil
		}
		if err := sleepCtx(ctx, backoff); err != nil {
			return fmt.Errorf("waiting for %d model events (%d stored): %w", want, n, err)
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// budgetReadTimeout bounds reading a tenant's budget when a run opens.
const budgetReadTimeout = 5 * time.Second

// TenantBudgets is a Config.TenantBudget that reads what is left of a
// tenant's budget (admission.Remaining: its settings in FLEET_TENANTS less
// the window's recorded spend) when a run opens; the run's gateway compares
// it with the live spend of the tenant's runs on this worker. It is read
// once per run: spend recorded elsewhere while the run goes is not seen
// until the next run opens. A tenant without a budget gets (nil, nil). A
// read that fails (a refused permission, a timeout) is an error: the run
// is refused, never run unlimited.
func TenantBudgets(js jetstream.JetStream, names protocol.Names, log zerolog.Logger) func(tenant string) (func() (float64, bool), error) {
	return func(tenant string) (func() (float64, bool), error) {
		ctx, cancel := context.WithTimeout(context.Background(), budgetReadTimeout)
		defer cancel()
		rem, limited, err := admission.Remaining(ctx, js, names, tenant, time.Now())
		if err != nil {
			log.Warn().Err(err).Str("tenant", tenant).Msg("reading the tenant's budget; the run is refused")
			return nil, err
		}
		if !limited {
			return nil, nil
		}
		return func() (float64, bool) { return rem, true }, nil
	}
}

// budgetUnread is the run's end when its tenant's budget cannot be read.
func budgetUnread(emit agent.EmitFunc, err error) (agent.Outcome, error) {
	return syntheticEnd(emit, protocol.CodeBudget, "worker: the tenant's model budget could not be read, so the run was refused rather than run without it: "+err.Error())
}

// ForwardRateLimits is a gateway.Config.OnRateLimit: an upstream 429 goes
// to admission (protocol.Names.RateLimitSubject, as a rejected
// rate_limit_event line), which pauses the tenant until the time the
// upstream said. A 529 (overloaded) is not the tenant's limit: dropped.
func ForwardRateLimits(nc *nats.Conn, names protocol.Names, log zerolog.Logger) func(gateway.RateLimit) {
	return func(rl gateway.RateLimit) {
		line, ok := rl.AdmissionLine()
		if !ok {
			return
		}
		if err := nc.Publish(names.RateLimitSubject(rl.Tenant), line); err != nil {
			log.Warn().Err(err).Str("tenant", rl.Tenant).Msg("forwarding the model's rate limit to admission")
		}
	}
}
