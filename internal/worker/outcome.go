package worker

import (
	"strings"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// outcome is how a run that got as far as its relay ends: the cases of the
// package doc's Outcomes list (an invalid job never gets here).
type outcome int

const (
	outcomeTerminal outcome = iota // the agent's result, or a synthetic one
	outcomeRetry                   // infrastructure failure: Nak with backoff
	outcomeHandback                // shutdown: Nak at once
	outcomeFenced                  // a later attempt owns the query
	outcomeParked                  // a session parked: parked status, Ack (settle.go)
)

// outcomeOf decides the outcome of a run (fenced: a later attempt or
// another writer owns the query; parked: a session parked); the order of
// the checks is their precedence.
func outcomeOf(fenced bool, out agent.Outcome, runErr error, parked bool) outcome {
	switch {
	case fenced:
		return outcomeFenced
	case out.HandedBack:
		return outcomeHandback
	case parked && runErr == nil:
		return outcomeParked
	case runErr != nil && out.Result == nil:
		return outcomeRetry
	}
	return outcomeTerminal
}

// terminalStatus maps a run's outcome to its terminal status event: what
// the agent's result says. The mode adds its part (mode.finish) and the
// attempt its identity (query.event) in settle.
func terminalStatus(out agent.Outcome) protocol.StatusEvent {
	r := out.Result
	if r == nil {
		// Not a path the runner takes (a run without a result was handed
		// back); should one appear, the query fails saying so instead of
		// the worker crashing on every delivery of the job.
		return protocol.StatusEvent{State: protocol.StateFailed, Result: &protocol.ResultSummary{IsError: true},
			Error: &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: "worker: the run ended without a result"}}
	}
	sum := &protocol.ResultSummary{
		Subtype: r.Subtype, IsError: r.IsError, NumTurns: r.NumTurns, DurationMS: r.DurationMS,
		TotalCostUSD: r.TotalCostUSD, SessionID: r.SessionID, Errors: r.Errors, Usage: r.Usage,
		Synthetic: out.Synthetic,
	}
	ev := protocol.StatusEvent{State: protocol.StateSucceeded, Result: sum}
	if !r.IsError {
		return ev
	}
	ev.State = protocol.StateFailed
	code := protocol.CodeAgentError
	switch out.Reason {
	case protocol.ReasonCancelled:
		ev.State, code = protocol.StateCancelled, protocol.CodeCancelled
	case protocol.ReasonTimeout:
		code = protocol.CodeTimeout
	case protocol.ReasonProcessExit:
		code = protocol.CodeProcessExit
	case protocol.ReasonSpawnFailed:
		code = protocol.CodeSpawnFailed
	case protocol.ReasonOutputTooLarge:
		code = protocol.CodeOutputTooLarge
	case protocol.ReasonStalled:
		code = protocol.CodeStalled
	case protocol.ReasonWorkspaceCheckout:
		code = protocol.CodeWorkspaceCheckout
	case protocol.ReasonBridgeIncompatible:
		code = protocol.CodeBridgeIncompatible
	}
	msg := "the agent reported an error"
	if len(r.Errors) > 0 {
		msg = r.Errors[0]
	} else if r.Result != nil && *r.Result != "" {
		msg = *r.Result
	}
	if x := r.XFleet; x != nil && x.StderrTail != "" {
		// Often the whole story, e.g. a flag the agent refused.
		sum.StderrTail = protocol.StatusStderrTail(x.StderrTail)
		if last := protocol.StderrLastLine(x.StderrTail); last != "" {
			msg += " · stderr: " + last
		}
	}
	if len(msg) > 1024 {
		msg = strings.ToValidUTF8(msg[:1024], "")
	}
	ev.Error = &protocol.ErrorInfo{Code: code, Message: msg}
	return ev
}
