package warm

import (
	"slices"
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// Profile is the key of warm agents: every input that shapes an agent's
// argv and environment. Two jobs with equal profiles can use the same
// kind of warm agent. It is comparable; lists and maps are kept in a
// canonical string form.
type Profile struct {
	// Sandbox is the provider's name ("local", "cloudflare").
	Sandbox string
	// Network is the job's network policy in the worker's canonical form
	// (after --network-default), "" when the worker has none.
	Network string
	// MCP is the MCP configuration in canonical form, "" for none.
	MCP string

	Model          string
	PermissionMode string
	// AllowedTools and DisallowedTools are the lists joined by NUL.
	AllowedTools, DisallowedTools string

	SystemPrompt, AppendSystemPrompt       string
	HasSystemPrompt, HasAppendSystemPrompt bool

	MaxTurns     int // 0: not set
	MaxBudgetUSD string

	// Env is options.env as sorted NUL-terminated name=value entries.
	Env string
	// RemoteApprovals relays permission requests (--permission-prompt-tool stdio).
	RemoteApprovals bool
}

// Placement is what a profile takes from the worker rather than the job's
// options: the sandbox provider the job resolves to, its network policy
// and its MCP configuration, each in a canonical string form.
type Placement struct {
	Sandbox, Network, MCP string
}

// ProfileOf returns the profile of job placed as pl. cold is not empty
// when the job must start a new agent instead, and says why.
func ProfileOf(job *protocol.Job, pl Placement) (p Profile, cold string) {
	o := job.Options
	switch {
	case o.Resume != "" || (job.Session != nil && job.Session.Continuation):
		return Profile{}, "a resumed session restores its files before the agent starts"
	case job.Workspace != nil:
		return Profile{}, "the agent reads its checkout (CLAUDE.md, settings) while it starts"
	case job.Setup != "":
		return Profile{}, "the setup script runs before the agent starts"
	}
	p = Profile{
		Sandbox: pl.Sandbox, Network: pl.Network, MCP: pl.MCP,
		Model: o.Model, PermissionMode: o.PermissionMode,
		AllowedTools:    strings.Join(o.AllowedTools, "\x00"),
		DisallowedTools: strings.Join(o.DisallowedTools, "\x00"),
		RemoteApprovals: job.Session.RemoteApprovals(),
	}
	if o.SystemPrompt != nil {
		p.SystemPrompt, p.HasSystemPrompt = *o.SystemPrompt, true
	}
	if o.AppendSystemPrompt != nil {
		p.AppendSystemPrompt, p.HasAppendSystemPrompt = *o.AppendSystemPrompt, true
	}
	if o.MaxTurns != nil {
		p.MaxTurns = *o.MaxTurns
	}
	if o.MaxBudgetUSD != nil {
		p.MaxBudgetUSD = strconv.FormatFloat(*o.MaxBudgetUSD, 'f', -1, 64)
	}
	if len(o.Env) > 0 {
		var b strings.Builder
		keys := make([]string, 0, len(o.Env))
		for k := range o.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b.WriteString(k + "=" + o.Env[k] + "\x00")
		}
		p.Env = b.String()
	}
	return p, ""
}

// Options returns the options the profile stands for (the ones that
// shape argv and environment; a job's others, like timeout_s, are the
// worker's).
func (p Profile) Options() protocol.Options {
	o := protocol.Options{Model: p.Model, PermissionMode: p.PermissionMode}
	if p.AllowedTools != "" {
		o.AllowedTools = strings.Split(p.AllowedTools, "\x00")
	}
	if p.DisallowedTools != "" {
		o.DisallowedTools = strings.Split(p.DisallowedTools, "\x00")
	}
	if p.HasSystemPrompt {
		s := p.SystemPrompt
		o.SystemPrompt = &s
	}
	if p.HasAppendSystemPrompt {
		s := p.AppendSystemPrompt
		o.AppendSystemPrompt = &s
	}
	if p.MaxTurns > 0 {
		n := p.MaxTurns
		o.MaxTurns = &n
	}
	if f, err := strconv.ParseFloat(p.MaxBudgetUSD, 64); err == nil {
		o.MaxBudgetUSD = &f
	}
	o.Env = p.EnvMap()
	return o
}

// EnvMap is options.env of the profile, nil when empty.
func (p Profile) EnvMap() map[string]string {
	if p.Env == "" {
		return nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(p.Env, "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// Argv is the warm agent's argv: agent.BuildArgv of the profile's options,
// then session.InputArgs (and session.PromptToolArgs with remote
// approvals), exactly as a cold session of the same job would have it.
func (p Profile) Argv(command []string) []string {
	argv := agent.BuildArgv(command, p.Options())
	argv = append(argv, session.InputArgs...)
	if p.RemoteApprovals {
		argv = append(argv, session.PromptToolArgs...)
	}
	return argv
}
