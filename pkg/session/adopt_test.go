package session_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// A session adopts a CLI started ahead with the session's argv (a warm
// agent): its turns run as with Start, the first one writing the first
// user message.
func TestAdoptRunsTurnsOnAProcessStartedAhead(t *testing.T) {
	t.Parallel()
	b := setup(t, echo)
	sb := b.sandbox(t)
	argv := append(agent.BuildArgv([]string{b.claude}, protocol.Options{}), session.InputArgs...)
	proc, err := sb.(sandbox.Interactive).StartInteractive(t.Context(), sandbox.ProcSpec{ID: "warm", Argv: argv})
	require.NoError(t, err)
	job := &protocol.Job{ID: "adopted", Session: &protocol.Session{}}
	cfg := session.Config{Command: []string{b.claude}, ExitGrace: 30 * time.Second}
	_, err = session.Adopt(cfg, session.Spec{Sandbox: sb, Job: job, Resume: "x"}, proc, nil)
	require.Error(t, err, "a resumed session adopts nothing")
	s, err := session.Adopt(cfg, session.Spec{Sandbox: sb, Job: job}, proc, func(l agent.Line) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.lines = append(b.lines, agent.Line{Raw: append([]byte(nil), l.Raw...), Msg: protocol.ParseMessage(append([]byte(nil), l.Raw...))})
		return nil
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	out := turn(t, s, "first question")
	require.Equal(t, "answer to first question", resultText(out.Result))
	out = turn(t, s, "second question")
	require.Equal(t, "answer to second question", resultText(out.Result))
	require.Equal(t, 2, s.Turns())
	require.NotEmpty(t, s.SessionID())
	require.NoError(t, s.Close(t.Context()))
	require.Equal(t, 0, s.ExitStatus().Code)
}
