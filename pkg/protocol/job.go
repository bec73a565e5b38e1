package protocol

import (
	"encoding/json"
	"fmt"
)

// MaxPromptBytes is the largest prompt a job may carry (256 KiB).
const MaxPromptBytes = 256 << 10

// Identifier patterns (docs/protocol.md).
const (
	TenantPattern = `^[a-z0-9][a-z0-9_-]{0,63}$`
	IDPattern     = `^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`
)

// DefaultTenant is the tenant of jobs that name none.
const DefaultTenant = "default"

// Sandbox provider names a job may ask for.
const (
	SandboxLocal      = "local"
	SandboxCloudflare = "cloudflare"
)

// Job is one query job as published on <prefix>.jobs.<tenant> (docs/protocol.md).
type Job struct {
	ID       string            `json:"id" msgpack:"id"`
	Prompt   string            `json:"prompt" msgpack:"prompt"`
	Tenant   string            `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
	Sandbox  string            `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`
	Options  Options           `json:"options" msgpack:"options"`
	Setup    string            `json:"setup,omitempty" msgpack:"setup,omitempty"` // docs/warm.md; see setup.go
	Metadata map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`
	// Trigger is set on the jobs the fleet starts itself (a schedule's
	// firing); statuses carry it.
	Trigger *Trigger `json:"trigger,omitempty" msgpack:"trigger,omitempty"`
	// Workspace, if set, runs the agent in a checkout of a git repository (docs/workspaces.md).
	Workspace *Workspace `json:"workspace,omitempty" msgpack:"workspace,omitempty"`
	// Session makes the job a multi-turn session (docs/sessions.md); see session.go.
	Session *Session `json:"session,omitempty" msgpack:"session,omitempty"`
	// MaxCostUSD, if set, caps the run's metered model spend; the model
	// gateway enforces it outside the agent (docs/gateway.md).
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty" msgpack:"max_cost_usd,omitempty"`

	// Network is what the agent may reach (docs/contained.md): "none", "open" or
	// {"allow":[…]}, raw JSON; decoded by the worker (egress.ForJob).
	Network json.RawMessage `json:"network,omitempty" msgpack:"network,omitempty"`

	// Limits are the run's cgroup v2 limits in a contained sandbox
	// (docs/contained.md); absent fields take the worker's defaults, and a job asking
	// above the worker's maximums fails at once (limits_not_allowed).
	Limits *Limits `json:"limits,omitempty" msgpack:"limits,omitempty"`
}

// Limits are a job's resource limits (Job.Limits). Zero means the worker's
// default.
type Limits struct {
	// MemoryMB is the run's memory.max, in MiB.
	MemoryMB int64 `json:"memory_mb,omitempty" msgpack:"memory_mb,omitempty"`
	// Pids is the run's pids.max: processes and threads at once.
	Pids int `json:"pids,omitempty" msgpack:"pids,omitempty"`
	// CPUWeight is the run's cpu.weight, 1 to 10000 (100 is an even share).
	CPUWeight int `json:"cpu_weight,omitempty" msgpack:"cpu_weight,omitempty"`
}

// CodeLimitsNotAllowed fails a job whose limits are above the worker's
// maximums, before any process starts.
const CodeLimitsNotAllowed = "limits_not_allowed"

func (l *Limits) validate() error {
	switch {
	case l == nil:
		return nil
	case l.MemoryMB < 0 || l.MemoryMB > 1<<30:
		return invalid("limits.memory_mb", fmt.Sprintf("must be between 0 and %d, got %d", 1<<30, l.MemoryMB))
	case l.Pids < 0 || l.Pids > 1<<22:
		return invalid("limits.pids", fmt.Sprintf("must be between 0 and %d, got %d", 1<<22, l.Pids))
	case l.CPUWeight < 0 || l.CPUWeight > 10000:
		return invalid("limits.cpu_weight", fmt.Sprintf("must be between 1 and 10000 (0: the worker's default), got %d", l.CPUWeight))
	}
	return nil
}

// Options tune one agent run. Every field is optional; nil pointers mean "not set".
type Options struct {
	Model              string   `json:"model,omitempty" msgpack:"model,omitempty"`
	MaxTurns           *int     `json:"max_turns,omitempty" msgpack:"max_turns,omitempty"`
	MaxBudgetUSD       *float64 `json:"max_budget_usd,omitempty" msgpack:"max_budget_usd,omitempty"`
	PermissionMode     string   `json:"permission_mode,omitempty" msgpack:"permission_mode,omitempty"`
	AllowedTools       []string `json:"allowed_tools,omitempty" msgpack:"allowed_tools,omitempty"`
	DisallowedTools    []string `json:"disallowed_tools,omitempty" msgpack:"disallowed_tools,omitempty"`
	SystemPrompt       *string  `json:"system_prompt,omitempty" msgpack:"system_prompt,omitempty"`
	AppendSystemPrompt *string  `json:"append_system_prompt,omitempty" msgpack:"append_system_prompt,omitempty"`
	Resume             string   `json:"resume,omitempty" msgpack:"resume,omitempty"`
	TimeoutS           *int     `json:"timeout_s,omitempty" msgpack:"timeout_s,omitempty"`
	// StallTimeout, a Go duration ("90s", "10m"), replaces the worker's
	// --stall-timeout for this job: a turn whose agent writes no line for
	// that long is stalled. It may not exceed the worker's
	// --stall-timeout-max (the job then fails with CodeInvalidJob naming
	// the field).
	StallTimeout string            `json:"stall_timeout,omitempty" msgpack:"stall_timeout,omitempty"`
	Env          map[string]string `json:"env,omitempty" msgpack:"env,omitempty"`
}
