package worker

import (
	"context"

	"github.com/agentfleet/agentfleet/internal/relay"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/journal"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// lines is where an attempt's agent lines go: its relay (package relay),
// which journals each line and then publishes it. The relay starts at the
// first line, once the Fleet-Seq read begun by the claim has answered (it
// ran while the sandbox was made).
type lines struct {
	ctx    context.Context
	q      *query
	jl     *journal.Log
	baseOf func() (uint64, error)
	window int
	// rateLimits is the tenant's subject for the admitter's rate limits.
	rateLimits string

	rel *relay.Relay
	err error
}

// newLines prepares the attempt's lines; nothing is read or sent yet.
func (q *query) newLines(ctx context.Context, jl *journal.Log, baseOf func() (uint64, error)) *lines {
	w := q.w
	window := w.cfg.PublishWindow
	if w.queries.replicated(ctx) {
		// A replicated stream rejects a second line checked against the
		// status subject while the first is still being proposed.
		window = 1
	}
	return &lines{ctx: ctx, q: q, jl: jl, baseOf: baseOf, window: window, rateLimits: w.names.RateLimitSubject(q.job.Tenant)}
}

// start starts the relay once (its error is kept: without the Fleet-Seq
// to continue from, no line can go out).
func (l *lines) start() error {
	if l.rel != nil || l.err != nil {
		return l.err
	}
	base, err := l.baseOf()
	if err != nil {
		l.err = err
		return err
	}
	q, w, job := l.q, l.q.w, l.q.job
	l.rel = relay.New(relay.Config{
		Pub: w.pub, NC: w.cfg.NC, Stream: w.names.QueriesStream(), Subject: w.names.QueryMsg(job.Tenant, job.ID),
		Tenant: job.Tenant, ID: job.ID, Attempt: q.attempt, MaxPayload: w.cfg.LineLimit(), Journal: l.jl,
		Metrics: w.metrics.relay, Log: q.log, Window: l.window, MaxQueued: w.cfg.QueueBytes, Base: base,
		Fence: q.fw, Hint: q.fenced.is, Timeout: w.cfg.PublishTimeout,
		Direct: w.direct, GroupMin: relay.GroupMin,
	})
	l.rel.Start(l.ctx)
	return nil
}

// emit is the agent.EmitFunc of the attempt.
func (l *lines) emit(line agent.Line) error {
	if err := l.start(); err != nil {
		return err
	}
	if protocol.MayReportRateLimit(line.Raw) {
		// The admitter reads rate limits here, not from every line
		// (package admission); best effort, like its pause.
		_ = l.q.w.cfg.NC.Publish(l.rateLimits, line.Raw)
	}
	return l.rel.Emit(line.Raw)
}
