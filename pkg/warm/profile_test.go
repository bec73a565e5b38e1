package warm_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
	"github.com/agentfleet/agentfleet/pkg/warm"
)

func fullJob() *protocol.Job {
	turns, budget, timeout := 7, 1.5, 60
	sys, app := "-you are terse", ""
	return &protocol.Job{ID: "q", Prompt: "p", Options: protocol.Options{
		Model: "claude-x", MaxTurns: &turns, MaxBudgetUSD: &budget, PermissionMode: "acceptEdits",
		AllowedTools: []string{"Read", "Bash(git *)"}, DisallowedTools: []string{"WebFetch"},
		SystemPrompt: &sys, AppendSystemPrompt: &app, TimeoutS: &timeout,
		Env: map[string]string{"B": "2", "A": "1=x"},
	}, Session: &protocol.Session{Approvals: protocol.ApprovalsRemote}}
}

// A warm agent's argv is exactly a cold session's for the same job.
func TestProfileArgvIsTheColdSessionsArgv(t *testing.T) {
	job := fullJob()
	p, cold := warm.ProfileOf(job, warm.Placement{Sandbox: "local", Network: "none"})
	require.Empty(t, cold)
	want := agent.BuildArgv([]string{"claude"}, job.Options)
	want = append(want, session.InputArgs...)
	want = append(want, session.PromptToolArgs...)
	require.Equal(t, want, p.Argv([]string{"claude"}))
	require.Equal(t, job.Options.Env, p.EnvMap())
}

// Equal options make equal profiles (a map key); any difference that
// shapes argv or environment makes another.
func TestProfilesKeyWhatShapesTheAgent(t *testing.T) {
	a, _ := warm.ProfileOf(fullJob(), warm.Placement{Sandbox: "local"})
	b, _ := warm.ProfileOf(fullJob(), warm.Placement{Sandbox: "local"})
	require.Equal(t, a, b)
	m := map[warm.Profile]int{a: 1}
	require.Equal(t, 1, m[b])

	other := fullJob()
	other.Options.TimeoutS = nil // not part of argv or environment
	c, _ := warm.ProfileOf(other, warm.Placement{Sandbox: "local"})
	require.Equal(t, a, c)

	for name, change := range map[string]func(j *protocol.Job, pl *warm.Placement){
		"model":    func(j *protocol.Job, _ *warm.Placement) { j.Options.Model = "claude-y" },
		"env":      func(j *protocol.Job, _ *warm.Placement) { j.Options.Env["A"] = "2" },
		"tools":    func(j *protocol.Job, _ *warm.Placement) { j.Options.AllowedTools = []string{"Read"} },
		"no sys":   func(j *protocol.Job, _ *warm.Placement) { j.Options.SystemPrompt = nil },
		"network":  func(_ *protocol.Job, pl *warm.Placement) { pl.Network = "open" },
		"mcp":      func(_ *protocol.Job, pl *warm.Placement) { pl.MCP = `{"mcpServers":{}}` },
		"sandbox":  func(_ *protocol.Job, pl *warm.Placement) { pl.Sandbox = "cloudflare" },
		"approval": func(j *protocol.Job, _ *warm.Placement) { j.Session = nil },
	} {
		j, pl := fullJob(), warm.Placement{Sandbox: "local"}
		change(j, &pl)
		d, _ := warm.ProfileOf(j, pl)
		require.NotEqual(t, a, d, name)
	}
}

// Jobs whose agent must start after something else start cold, and say why.
func TestJobsThatMustStartColdSayWhy(t *testing.T) {
	for name, j := range map[string]*protocol.Job{
		"resume":       {ID: "q", Prompt: "p", Options: protocol.Options{Resume: "q0"}},
		"continuation": {ID: "q", Prompt: "p", Session: &protocol.Session{Continuation: true}},
		"setup":        {ID: "q", Prompt: "p", Setup: "make deps"},
		"workspace":    {ID: "q", Prompt: "p", Workspace: &protocol.Workspace{Repo: "https://example.com/r.git"}},
	} {
		_, cold := warm.ProfileOf(j, warm.Placement{})
		require.NotEmpty(t, cold, name)
	}
}
