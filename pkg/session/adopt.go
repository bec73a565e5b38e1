package session

import (
	"context"
	"errors"
	"time"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Adopt is Start with a process already started in spec.Sandbox (a warm
// agent, docs/warm.md) with the argv Start would give spec, and still waiting
// for its first user message: its output is read from proc.Stdout, and
// the first Turn writes the first message. spec.Resume must be empty (a
// resumed session restores its files before its agent starts).
func Adopt(cfg Config, spec Spec, proc sandbox.InteractiveProcess, emit agent.EmitFunc) (*Session, error) {
	cfg = cfg.withDefaults()
	switch {
	case spec.Sandbox == nil || spec.Job == nil || proc == nil:
		return nil, errors.New("session: Adopt needs a Sandbox, a Job and a process")
	case spec.Resume != "":
		return nil, errors.New("session: a resumed session cannot adopt a process started ahead")
	}
	return newSession(cfg, spec, proc, emit, ""), nil
}

// newSession watches proc, the session's agent process.
func newSession(cfg Config, spec Spec, proc sandbox.InteractiveProcess, emit agent.EmitFunc, resume string) *Session {
	s := &Session{
		cfg: cfg, proc: proc, emit: emit, spec: spec,
		log:        cfg.Logger.With().Str("component", "session").Str("query_id", spec.Job.ID).Logger(),
		results:    make(chan *protocol.Result, 16),
		readerDone: make(chan struct{}),
		waitDone:   make(chan struct{}),
		pending:    make(map[string]Request),
		sessionID:  resume,
		started:    time.Now(),
	}
	go func() {
		defer close(s.readerDone)
		s.rr = s.read(proc.Stdout())
	}()
	go func() {
		defer close(s.waitDone)
		st, err := proc.Wait(context.Background())
		if err == nil {
			s.exit = &st
		}
	}()
	return s
}
