package worker

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/tracing"
)

// Traces (docs/tracing.md). An attempt is a fleet.attempt span, the child
// of the producer's traceparent (the job message's traceparent and
// tracestate headers, kept by admission) or the root of a new trace; its
// context rides on the run's context, so the attempt's steps
// (fleet.sandbox.create, ...) are its children. The agent's run is an
// invoke_agent span with one execute_tool span per tool call read from
// the stream; the agent gets its traceparent as TRACEPARENT, and the
// model gateway makes the run's chat spans under it.

// Header names of the W3C trace context on a job message.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// headerAny is the first value of name in h, matched in any case (NATS
// header names are case-sensitive; producers write them either way).
func headerAny(h map[string][]string, name string) string {
	for k, v := range h {
		if len(v) > 0 && len(k) == len(name) && equalFold(k, name) {
			return v[0]
		}
	}
	return ""
}

func equalFold(a, b string) bool {
	for i := range len(a) {
		x, y := a[i]|0x20, b[i]|0x20
		if x != y {
			return false
		}
	}
	return true
}

// startAttempt starts q's fleet.attempt span, a child of the job
// message's trace context, and puts it on ctx.
func startAttempt(w *Worker, ctx context.Context, msg jetstream.Msg, job *protocol.Job, attempt int) (context.Context, trace.Span) {
	h := map[string][]string(msg.Headers())
	tp := headerAny(h, headerTraceparent)
	parent, ok := tracing.Extract(context.Background(), tp, headerAny(h, headerTracestate))
	if tp != "" && !ok {
		w.log.Debug().Str("tenant", job.Tenant).Str("query_id", job.ID).Msg("the job's traceparent is malformed; starting a new trace")
	}
	_, span := w.cfg.Tracing.Tracer().Start(parent, "fleet.attempt", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tracing.FleetTenant.String(job.Tenant), tracing.FleetQueryID.String(job.ID), tracing.FleetAttempt.Int(attempt)))
	return trace.ContextWithSpan(ctx, span), span
}

// traceID is the run's trace id, "" when it has none (tracing off and no
// traceparent).
func (q *query) traceID() string { return tracing.TraceID(q.runCtx) }

// endAttempt ends the attempt span with the run's last status.
func endAttempt(span trace.Span, ev *protocol.StatusEvent) {
	if ev != nil {
		span.SetAttributes(attribute.String("fleet.state", string(ev.State)))
		if ev.Error != nil {
			span.SetStatus(codes.Error, ev.Error.Code+": "+ev.Error.Message)
		}
	}
	span.End()
}

// agentTrace is the invoke_agent span of a run and its tool spans.
type agentTrace struct {
	span  trace.Span
	ctx   context.Context
	mu    sync.Mutex
	tools map[string]trace.Span
	sid   string
}

// startAgent starts the invoke_agent span of q's run (a child of ctx's
// span) and gives the agent its TRACEPARENT in env.
func (q *query) startAgent(ctx context.Context, env map[string]string) *agentTrace {
	name := "claude-code"
	if len(q.w.cfg.Sessions.Command) > 0 {
		name = filepath.Base(q.w.cfg.Sessions.Command[0])
	}
	attrs := []attribute.KeyValue{
		tracing.GenAIOperationName.String("invoke_agent"), tracing.GenAIProviderName.String("anthropic"),
		tracing.GenAIAgentName.String(name),
	}
	if m := q.job.Options.Model; m != "" {
		attrs = append(attrs, tracing.GenAIRequestModel.String(m))
	}
	actx, span := q.w.cfg.Tracing.Tracer().Start(ctx, "invoke_agent "+name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	if tp, _ := tracing.Inject(actx); tp != "" && env != nil {
		env["TRACEPARENT"] = tp
	}
	return &agentTrace{span: span, ctx: actx, tools: map[string]trace.Span{}}
}

// wrap returns emit with every line read for tool spans and the session.
func (a *agentTrace) wrap(q *query, emit agent.EmitFunc) agent.EmitFunc {
	tracer := q.w.cfg.Tracing.Tracer()
	return func(l agent.Line) error {
		if !l.Synthetic {
			a.line(tracer, l.Msg)
		}
		return emit(l)
	}
}

func (a *agentTrace) line(tracer trace.Tracer, m protocol.Message) {
	uses, results := protocol.ToolEvents(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sid == "" && m.SessionID != "" {
		a.sid = m.SessionID
		a.span.SetAttributes(tracing.GenAIConversationID.String(m.SessionID))
	}
	for _, u := range uses {
		_, s := tracer.Start(a.ctx, "execute_tool "+u.Name, trace.WithAttributes(
			tracing.GenAIOperationName.String("execute_tool"), tracing.GenAIToolName.String(u.Name), tracing.GenAIToolCallID.String(u.ID)))
		a.tools[u.ID] = s
	}
	for _, r := range results {
		s, ok := a.tools[r.ToolUseID]
		if !ok {
			continue
		}
		delete(a.tools, r.ToolUseID)
		if r.IsError {
			s.SetStatus(codes.Error, "the tool reported an error")
			s.SetAttributes(tracing.ErrorType.String("tool_error"))
		}
		s.End()
	}
}

// end ends the tool spans left open and the agent's span, with the run's
// usage and outcome.
func (a *agentTrace) end(out agent.Outcome, err error) {
	a.mu.Lock()
	for id, s := range a.tools {
		s.SetStatus(codes.Error, "the run ended before the tool's result")
		s.End()
		delete(a.tools, id)
	}
	a.mu.Unlock()
	if r := out.Result; r != nil {
		if u := usageOf(r); u.ok {
			a.span.SetAttributes(tracing.GenAIUsageInputTokens.Int64(u.in), tracing.GenAIUsageOutputTokens.Int64(u.out))
		}
		a.span.SetAttributes(tracing.FleetCostUSD.Float64(r.TotalCostUSD))
		if r.IsError {
			a.span.SetStatus(codes.Error, "the run's result is an error")
			if out.Reason != "" {
				a.span.SetAttributes(tracing.ErrorType.String(out.Reason))
			}
		}
	}
	if err != nil {
		a.span.SetStatus(codes.Error, err.Error())
	}
	a.span.End()
}

type usage struct {
	in, out int64
	ok      bool
}

// usageOf reads a result's token counts (input counts the cache's tokens
// too).
func usageOf(r *protocol.Result) usage {
	var u struct {
		In          int64 `json:"input_tokens"`
		Out         int64 `json:"output_tokens"`
		CacheCreate int64 `json:"cache_creation_input_tokens"`
		CacheRead   int64 `json:"cache_read_input_tokens"`
	}
	if len(r.Usage) == 0 || json.Unmarshal(r.Usage, &u) != nil {
		return usage{}
	}
	return usage{in: u.In + u.CacheCreate + u.CacheRead, out: u.Out, ok: true}
}
