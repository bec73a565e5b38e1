package protocol

import "encoding/json"

// MaxPromptBytes is the largest prompt a job may carry (256 KiB).
const MaxPromptBytes = 256 << 10

// Identifier patterns of SPEC 3.
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

// Job is one query job as published on <prefix>.jobs.<tenant> (SPEC 3.1).
type Job struct {
	ID       string            `json:"id" msgpack:"id"`
	Prompt   string            `json:"prompt" msgpack:"prompt"`
	Tenant   string            `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
	Sandbox  string            `json:"sandbox,omitempty" msgpack:"sandbox,omitempty"`
	Options  Options           `json:"options" msgpack:"options"`
	Setup    string            `json:"setup,omitempty" msgpack:"setup,omitempty"` // SPEC 15; see setup.go
	Metadata map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`
	// Workspace, if set, runs the agent in a checkout of a git repository (SPEC 8).
	Workspace *Workspace `json:"workspace,omitempty" msgpack:"workspace,omitempty"`
	// Session makes the job a multi-turn session (SPEC 9); see session.go.
	Session *Session `json:"session,omitempty" msgpack:"session,omitempty"`
	// MaxCostUSD, if set, caps the run's metered model spend; the model
	// gateway enforces it outside the agent (SPEC 13).
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty" msgpack:"max_cost_usd,omitempty"`

	// Network is what the agent may reach (SPEC 14): "none", "open" or
	// {"allow":[…]}, raw JSON; decoded by the worker (egress.ForJob).
	Network json.RawMessage `json:"network,omitempty" msgpack:"network,omitempty"`
}

// Options tune one agent run. Every field is optional; nil pointers mean "not set".
type Options struct {
	Model              string            `json:"model,omitempty" msgpack:"model,omitempty"`
	MaxTurns           *int              `json:"max_turns,omitempty" msgpack:"max_turns,omitempty"`
	MaxBudgetUSD       *float64          `json:"max_budget_usd,omitempty" msgpack:"max_budget_usd,omitempty"`
	PermissionMode     string            `json:"permission_mode,omitempty" msgpack:"permission_mode,omitempty"`
	AllowedTools       []string          `json:"allowed_tools,omitempty" msgpack:"allowed_tools,omitempty"`
	DisallowedTools    []string          `json:"disallowed_tools,omitempty" msgpack:"disallowed_tools,omitempty"`
	SystemPrompt       *string           `json:"system_prompt,omitempty" msgpack:"system_prompt,omitempty"`
	AppendSystemPrompt *string           `json:"append_system_prompt,omitempty" msgpack:"append_system_prompt,omitempty"`
	Resume             string            `json:"resume,omitempty" msgpack:"resume,omitempty"`
	TimeoutS           *int              `json:"timeout_s,omitempty" msgpack:"timeout_s,omitempty"`
	Env                map[string]string `json:"env,omitempty" msgpack:"env,omitempty"`
}
