package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// An adopted process (started before the run, given its input by the
// caller) is read to its result like one Run started; a result it never
// writes gets the runner's synthetic one.
func TestAdoptRunsAnAlreadyStartedProcess(t *testing.T) {
	b := setup(t)
	r := newRunner(t, "unused", nil)
	require.Equal(t, childCommand(t, "unused"), r.Command())
	// The process echoes its first input line inside a result.
	script := `read line; printf '{"type":"result","subtype":"success","is_error":false,"result":"%s"}\n' "$line"`
	proc, err := b.sb.(sandbox.Interactive).StartInteractive(context.Background(), sandbox.ProcSpec{ID: "warm", Argv: []string{"sh", "-c", script}})
	require.NoError(t, err)
	_, err = proc.Stdin().Write([]byte("first-input\n"))
	require.NoError(t, err)
	require.NoError(t, proc.Stdin().Close())
	out, err := r.Adopt(context.Background(), agent.Request{Sandbox: b.sb, Job: job("p")}, proc, b.lines.emit)
	require.NoError(t, err)
	require.True(t, out.Succeeded(), "%+v", out)
	require.False(t, out.Synthetic)
	lines, _ := b.lines.all()
	require.Len(t, lines, 1)
	require.Contains(t, string(lines[0]), "first-input")

	// An adopted process that exits without a result: one synthetic result.
	b2 := setup(t)
	proc, err = b2.sb.(sandbox.Interactive).StartInteractive(context.Background(), sandbox.ProcSpec{ID: "warm", Argv: []string{"sh", "-c", "read line; exit 3"}})
	require.NoError(t, err)
	require.NoError(t, proc.Stdin().Close())
	out, err = r.Adopt(context.Background(), agent.Request{Sandbox: b2.sb, Job: job("p")}, proc, b2.lines.emit)
	require.NoError(t, err)
	require.True(t, out.Synthetic)
	require.Equal(t, "process_exit", out.Reason)
	lines, synth := b2.lines.all()
	require.Len(t, lines, 1)
	require.True(t, synth[0])
	require.True(t, strings.Contains(string(lines[0]), "process_exit"))

	_, err = r.Adopt(context.Background(), agent.Request{Sandbox: b.sb, Job: job("p")}, nil, b.lines.emit)
	require.Error(t, err)
}
