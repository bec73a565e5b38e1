package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// Stalls. An agent that stops writing while its turn runs (and does not
// exit) would hold its slot until the job's timeout_s, or forever. The
// stall watch of a run measures the silence since the agent's last line
// while a turn runs: from the turn's first line to its result line. When
// it reaches the stall timeout (options.stall_timeout, else the worker's
// --stall-timeout) the turn is stalled, unless
//   - the agent waits for an approval (a can_use_tool control_request not
//     answered yet): never a stall; or
//   - a tool call is in progress (a tool_use without its tool_result) and
//     the sandbox's processes used CPU since the last check (at least
//     stallMinCPU, or 1% of a core over the interval): the silence starts
//     again. A tool whose processes sleep is silence like any other.
//
// A stalled one-shot run is stopped and ends failed, code stalled
// (oneshot.go); a stalled session turn is interrupted, and its agent
// stopped after --stall-grace when it does not answer (session_loop.go).

// stallMinCPU is the least CPU time that counts as a busy tool per check
// (two clock ticks, so an idle process's stray tick does not count).
const stallMinCPU = 20 * time.Millisecond

// stallTimeout is the stall timeout of job: its options.stall_timeout,
// which may not exceed max (0: no maximum), else def (0: no stall watch).
func stallTimeout(job *protocol.Job, def, max time.Duration) (time.Duration, error) {
	d, err := job.Options.StallTimeoutDuration()
	if err != nil {
		return 0, err
	}
	if d == 0 {
		return def, nil
	}
	if max > 0 && d > max {
		return 0, &protocol.ValidationError{Field: "options.stall_timeout",
			Reason: fmt.Sprintf("%s is above this worker's maximum (--stall-timeout-max %s)", d, max)}
	}
	return d, nil
}

// Watch states.
const (
	stallOff     = iota // no turn runs (or it stalled already)
	stallArmed          // a turn runs; the clock starts at its first line
	stallRunning        // the clock runs from last
)

// stallWatch is one run's stall watch. Lines go through wrap's EmitFunc;
// stalls come out of fired, once per stall (then the watch is off until
// armed again).
type stallWatch struct {
	timeout time.Duration
	cpu     sandbox.CPUMeter // nil: tool calls do not extend the silence
	fired   chan time.Duration
	kick    chan struct{}
	log     zerolog.Logger

	mu       sync.Mutex
	state    int
	last     time.Time
	tools    map[string]bool    // tool calls in progress
	asks     map[string]bool    // approvals pending
	cpuAt    time.Duration      // the last CPU reading
	cpuKnown bool               // cpuAt is a reading of this tool period
	checked  func(stalled bool) // Config.Test.StallChecked
}

// newStallWatch returns q's watch with timeout over sb's processes,
// started (its goroutine ends with ctx); nil when timeout is 0.
func newStallWatch(ctx context.Context, q *query, timeout time.Duration, sb sandbox.Sandbox) *stallWatch {
	if timeout <= 0 {
		return nil
	}
	s := &stallWatch{timeout: timeout, fired: make(chan time.Duration, 1), kick: make(chan struct{}, 1),
		log: q.log, tools: map[string]bool{}, asks: map[string]bool{}}
	if h := q.w.cfg.Test.StallChecked; h != nil {
		tenant, id := q.job.Tenant, q.job.ID
		s.checked = func(stalled bool) { h(tenant, id, stalled) }
	}
	if m, ok := sb.(sandbox.CPUMeter); ok {
		s.cpu = m
	}
	go s.run(ctx)
	return s
}

// wrap returns emit with every line noted first.
func (s *stallWatch) wrap(emit agent.EmitFunc) agent.EmitFunc {
	if s == nil {
		return emit
	}
	return func(l agent.Line) error {
		if !l.Synthetic {
			s.note(l.Msg)
		}
		return emit(l)
	}
}

// arm starts watching a turn: the clock starts at its next line.
func (s *stallWatch) arm() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.state = stallArmed
	s.mu.Unlock()
}

// disarm stops watching (the turn ended).
func (s *stallWatch) disarm() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.state = stallOff
	clear(s.tools)
	clear(s.asks)
	s.mu.Unlock()
}

// answered notes that the approval requestID was answered: the agent's
// silence starts now.
func (s *stallWatch) answered(requestID string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.asks, requestID)
	s.last = time.Now()
	s.mu.Unlock()
}

// note takes one line of the agent.
func (s *stallWatch) note(m protocol.Message) {
	uses, results := protocol.ToolEvents(m)
	var req string
	if m.Type == protocol.TypeControlRequest {
		if r, ok := session.ParseRequest(m.Raw); ok {
			req = r.RequestID
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stallOff {
		return
	}
	s.last = time.Now()
	s.state = stallRunning
	for _, u := range uses {
		s.tools[u.ID] = true
	}
	for _, r := range results {
		delete(s.tools, r.ToolUseID)
	}
	if len(s.tools) == 0 {
		s.cpuKnown = false
	}
	if req != "" {
		s.asks[req] = true
	}
	if m.Type == "control_cancel_request" {
		clear(s.asks) // the agent withdrew its request(s)
	}
	if m.IsResult() {
		s.state = stallOff
	}
	if len(uses) > 0 {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// run checks the silence when it may have reached the timeout, and takes
// the CPU reading a tool call starts from.
func (s *stallWatch) run(ctx context.Context) {
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			s.baseline()
			continue
		case <-t.C:
		}
		next, silence, reached, stalled := s.check()
		if reached && s.checked != nil {
			s.checked(stalled)
		}
		if stalled {
			s.log.Warn().Dur("silence", silence).Dur("stall_timeout", s.timeout).Msg("the agent stalled")
			select {
			case s.fired <- silence:
			default:
			}
		}
		t.Reset(next)
	}
}

// baseline takes the first CPU reading of a tool period.
func (s *stallWatch) baseline() {
	s.mu.Lock()
	need := s.cpu != nil && len(s.tools) > 0 && !s.cpuKnown
	s.mu.Unlock()
	if !need {
		return
	}
	v, err := s.cpu.CPUTime()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && len(s.tools) > 0 {
		s.cpuAt, s.cpuKnown = v, true
	}
}

// check decides whether the turn stalled, and when to look again;
// reached: the silence had reached the timeout.
func (s *stallWatch) check() (next, silence time.Duration, reached, stalled bool) {
	s.mu.Lock()
	state, idle, tools, asks, known, at := s.state, time.Since(s.last), len(s.tools), len(s.asks), s.cpuKnown, s.cpuAt
	s.mu.Unlock()
	switch {
	case state != stallRunning:
		return s.timeout, 0, false, false
	case idle < s.timeout:
		return s.timeout - idle, 0, false, false
	case asks > 0:
		return s.timeout, 0, true, false // answered() restarts the clock
	}
	if tools > 0 && s.cpu != nil {
		v, err := s.cpu.CPUTime()
		busy := err == nil && known && v-at >= max(stallMinCPU, s.timeout/100)
		s.mu.Lock()
		if err == nil && len(s.tools) > 0 {
			s.cpuAt, s.cpuKnown = v, true
		}
		if busy && s.state == stallRunning {
			s.last = time.Now()
		}
		s.mu.Unlock()
		if busy {
			return s.timeout, 0, true, false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stallRunning || time.Since(s.last) < s.timeout || len(s.asks) > 0 {
		return s.timeout, 0, false, false // a line came meanwhile
	}
	s.state = stallOff
	return s.timeout, time.Since(s.last), true, true
}
