package protocol

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

// fullJob is a valid job that sets every field.
func fullJob() *Job {
	return &Job{
		ID:      "q-1_a",
		Prompt:  "Summarise README.md in one sentence. ✓",
		Tenant:  "acme",
		Sandbox: SandboxLocal,
		Options: Options{
			Model:              "claude-opus-4-1[1m]",
			MaxTurns:           ptr(30),
			MaxBudgetUSD:       ptr(2.5),
			PermissionMode:     "acceptEdits",
			AllowedTools:       []string{"Read", "Bash(git log:*)", "mcp__github__get_issue"},
			DisallowedTools:    []string{"WebFetch"},
			SystemPrompt:       ptr("You are terse."),
			AppendSystemPrompt: ptr("Answer in English."),
			Resume:             "b401fe91-732e-4a27-94aa-942d088a6ed5",
			TimeoutS:           ptr(600),
			Env:                map[string]string{"GIT_AUTHOR_NAME": "fleet", "_X1": ""},
		},
		Metadata: map[string]string{"ticket": "OPS-12", "ünïcode": "välue"},
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()

	repeat := func(n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = "Tool" + strconv.Itoa(i)
		}
		return s
	}
	entries := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m["K"+strconv.Itoa(i)] = "v"
		}
		return m
	}

	tests := []struct {
		name          string
		mutate        func(j *Job)
		subjectTenant string
		requireID     bool
		wantField     string // "" = valid
	}{
		{name: "full job is valid", mutate: func(*Job) {}, subjectTenant: "acme", requireID: true},
		{name: "minimal job is valid", mutate: func(j *Job) { *j = Job{ID: "q1", Prompt: "hi"} }, requireID: true},

		{name: "id required on direct publish", mutate: func(j *Job) { j.ID = "" }, requireID: true, wantField: "id"},
		{name: "id optional via dispatcher", mutate: func(j *Job) { j.ID = "" }},
		{name: "id with dot", mutate: func(j *Job) { j.ID = "a.b" }, wantField: "id"},
		{name: "id with wildcard", mutate: func(j *Job) { j.ID = "*" }, wantField: "id"},
		{name: "id starting with dash", mutate: func(j *Job) { j.ID = "-a" }, wantField: "id"},
		{name: "id too long", mutate: func(j *Job) { j.ID = strings.Repeat("a", 129) }, wantField: "id"},
		{name: "id of 128 bytes", mutate: func(j *Job) { j.ID = strings.Repeat("a", 128) }},

		{name: "tenant upper case", mutate: func(j *Job) { j.Tenant = "Acme" }, wantField: "tenant"},
		{name: "tenant too long", mutate: func(j *Job) { j.Tenant = strings.Repeat("a", 65) }, wantField: "tenant"},
		{name: "tenant differs from subject", mutate: func(j *Job) { j.Tenant = "other" }, subjectTenant: "acme", wantField: "tenant"},
		{name: "invalid subject tenant", mutate: func(j *Job) { j.Tenant = "" }, subjectTenant: "A.B", wantField: "subject"},

		{name: "prompt missing", mutate: func(j *Job) { j.Prompt = "" }, wantField: "prompt"},
		{name: "prompt at limit", mutate: func(j *Job) { j.Prompt = strings.Repeat("p", MaxPromptBytes) }},
		{name: "prompt over limit", mutate: func(j *Job) { j.Prompt = strings.Repeat("p", MaxPromptBytes+1) }, wantField: "prompt"},
		{name: "prompt invalid UTF-8", mutate: func(j *Job) { j.Prompt = "a\xffb" }, wantField: "prompt"},
		{name: "prompt with NUL", mutate: func(j *Job) { j.Prompt = "a\x00b" }, wantField: "prompt"},

		{name: "sandbox cloudflare", mutate: func(j *Job) { j.Sandbox = SandboxCloudflare }},
		{name: "sandbox unknown", mutate: func(j *Job) { j.Sandbox = "docker" }, wantField: "sandbox"},

		{name: "model with path and colon", mutate: func(j *Job) { j.Options.Model = "us.anthropic/claude:v1,x_y" }},
		{name: "model starting with dash", mutate: func(j *Job) { j.Options.Model = "--dangerously" }, wantField: "options.model"},
		{name: "model with space", mutate: func(j *Job) { j.Options.Model = "a b" }, wantField: "options.model"},
		{name: "model too long", mutate: func(j *Job) { j.Options.Model = strings.Repeat("m", 129) }, wantField: "options.model"},
		{name: "model invalid UTF-8", mutate: func(j *Job) { j.Options.Model = "\xff" }, wantField: "options.model"},

		{name: "max_turns zero", mutate: func(j *Job) { j.Options.MaxTurns = ptr(0) }, wantField: "options.max_turns"},
		{name: "max_turns one", mutate: func(j *Job) { j.Options.MaxTurns = ptr(1) }},
		{name: "max_turns at limit", mutate: func(j *Job) { j.Options.MaxTurns = ptr(10000) }},
		{name: "max_turns over limit", mutate: func(j *Job) { j.Options.MaxTurns = ptr(10001) }, wantField: "options.max_turns"},

		{name: "budget zero", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(0.0) }, wantField: "options.max_budget_usd"},
		{name: "budget negative", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(-1.0) }, wantField: "options.max_budget_usd"},
		{name: "budget NaN", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(math.NaN()) }, wantField: "options.max_budget_usd"},
		{name: "budget infinite", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(math.Inf(1)) }, wantField: "options.max_budget_usd"},
		{name: "budget at limit", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(10000.0) }},
		{name: "budget over limit", mutate: func(j *Job) { j.Options.MaxBudgetUSD = ptr(10000.01) }, wantField: "options.max_budget_usd"},

		{name: "max_cost_usd set", mutate: func(j *Job) { j.MaxCostUSD = ptr(0.5) }},
		{name: "max_cost_usd negative", mutate: func(j *Job) { j.MaxCostUSD = ptr(-1.0) }, wantField: "max_cost_usd"},
		{name: "max_cost_usd zero", mutate: func(j *Job) { j.MaxCostUSD = ptr(0.0) }, wantField: "max_cost_usd"},
		{name: "max_cost_usd NaN", mutate: func(j *Job) { j.MaxCostUSD = ptr(math.NaN()) }, wantField: "max_cost_usd"},
		{name: "max_cost_usd infinite", mutate: func(j *Job) { j.MaxCostUSD = ptr(math.Inf(1)) }, wantField: "max_cost_usd"},
		{name: "max_cost_usd over limit", mutate: func(j *Job) { j.MaxCostUSD = ptr(10000.01) }, wantField: "max_cost_usd"},

		{name: "permission mode plan", mutate: func(j *Job) { j.Options.PermissionMode = "plan" }},
		{name: "permission mode unknown", mutate: func(j *Job) { j.Options.PermissionMode = "yolo" }, wantField: "options.permission_mode"},

		{name: "allowed tool empty", mutate: func(j *Job) { j.Options.AllowedTools = []string{"Read", ""} }, wantField: "options.allowed_tools[1]"},
		{name: "allowed tool flag", mutate: func(j *Job) { j.Options.AllowedTools = []string{"--mcp-config"} }, wantField: "options.allowed_tools[0]"},
		{name: "allowed tool NUL", mutate: func(j *Job) { j.Options.AllowedTools = []string{"Re\x00ad"} }, wantField: "options.allowed_tools[0]"},
		{name: "allowed tool invalid UTF-8", mutate: func(j *Job) { j.Options.AllowedTools = []string{"\xc3"} }, wantField: "options.allowed_tools[0]"},
		{name: "allowed tools at limit", mutate: func(j *Job) { j.Options.AllowedTools = repeat(256) }},
		{name: "allowed tools over limit", mutate: func(j *Job) { j.Options.AllowedTools = repeat(257) }, wantField: "options.allowed_tools"},
		{name: "disallowed tool flag", mutate: func(j *Job) { j.Options.DisallowedTools = []string{"-p"} }, wantField: "options.disallowed_tools[0]"},
		{name: "disallowed tools over limit", mutate: func(j *Job) { j.Options.DisallowedTools = repeat(257) }, wantField: "options.disallowed_tools"},

		{name: "system prompt invalid UTF-8", mutate: func(j *Job) { j.Options.SystemPrompt = ptr("\xff") }, wantField: "options.system_prompt"},
		{name: "system prompt too long", mutate: func(j *Job) { j.Options.SystemPrompt = ptr(strings.Repeat("s", MaxPromptBytes+1)) }, wantField: "options.system_prompt"},
		{name: "append system prompt NUL", mutate: func(j *Job) { j.Options.AppendSystemPrompt = ptr("\x00") }, wantField: "options.append_system_prompt"},
		{name: "empty system prompt allowed", mutate: func(j *Job) { j.Options.SystemPrompt = ptr("") }},

		{name: "resume starting with dash", mutate: func(j *Job) { j.Options.Resume = "-rf" }, wantField: "options.resume"},
		{name: "resume with equals", mutate: func(j *Job) { j.Options.Resume = "a=b" }, wantField: "options.resume"},
		{name: "resume too long", mutate: func(j *Job) { j.Options.Resume = strings.Repeat("r", 129) }, wantField: "options.resume"},

		{name: "timeout zero", mutate: func(j *Job) { j.Options.TimeoutS = ptr(0) }, wantField: "options.timeout_s"},
		{name: "timeout one week", mutate: func(j *Job) { j.Options.TimeoutS = ptr(604800) }},
		{name: "timeout over a week", mutate: func(j *Job) { j.Options.TimeoutS = ptr(604801) }, wantField: "options.timeout_s"},
		{name: "stall timeout not a duration", mutate: func(j *Job) { j.Options.StallTimeout = "10" }, wantField: "options.stall_timeout"},
		{name: "stall timeout zero", mutate: func(j *Job) { j.Options.StallTimeout = "0s" }, wantField: "options.stall_timeout"},
		{name: "stall timeout over a week", mutate: func(j *Job) { j.Options.StallTimeout = "169h" }, wantField: "options.stall_timeout"},

		{name: "env key with dash", mutate: func(j *Job) { j.Options.Env = map[string]string{"A-B": "x"} }, wantField: "options.env"},
		{name: "env key starting with digit", mutate: func(j *Job) { j.Options.Env = map[string]string{"1A": "x"} }, wantField: "options.env"},
		{name: "env key with equals", mutate: func(j *Job) { j.Options.Env = map[string]string{"A=B": "x"} }, wantField: "options.env"},
		{name: "env value NUL", mutate: func(j *Job) { j.Options.Env = map[string]string{"A": "x\x00"} }, wantField: "options.env.A"},
		{name: "env value invalid UTF-8", mutate: func(j *Job) { j.Options.Env = map[string]string{"A": "\xff"} }, wantField: "options.env.A"},
		{name: "env at limit", mutate: func(j *Job) { j.Options.Env = entries(64) }},
		{name: "env over limit", mutate: func(j *Job) { j.Options.Env = entries(65) }, wantField: "options.env"},

		{name: "metadata over limit", mutate: func(j *Job) { j.Metadata = entries(65) }, wantField: "metadata"},
		{name: "metadata empty key", mutate: func(j *Job) { j.Metadata = map[string]string{"": "v"} }, wantField: "metadata"},
		{name: "metadata key at limit", mutate: func(j *Job) { j.Metadata = map[string]string{strings.Repeat("k", 128): "v"} }},
		{name: "metadata key too long", mutate: func(j *Job) { j.Metadata = map[string]string{strings.Repeat("k", 129): "v"} }, wantField: "metadata"},
		{name: "metadata key invalid UTF-8", mutate: func(j *Job) { j.Metadata = map[string]string{"\xff": "v"} }, wantField: "metadata"},
		{name: "metadata value at limit", mutate: func(j *Job) { j.Metadata = map[string]string{"k": strings.Repeat("v", 4096)} }},
		{name: "metadata value too long", mutate: func(j *Job) { j.Metadata = map[string]string{"k": strings.Repeat("v", 4097)} }, wantField: "metadata.k"},
		{name: "metadata value invalid UTF-8", mutate: func(j *Job) { j.Metadata = map[string]string{"k": "\xed\xa0\x80"} }, wantField: "metadata.k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job := fullJob()
			tt.mutate(job)
			err := job.Validate(tt.subjectTenant, tt.requireID)
			if tt.wantField == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalidJob)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tt.wantField, ve.Field, "error: %v", err)
			require.NotEmpty(t, ve.Reason)
			require.Contains(t, err.Error(), tt.wantField)
		})
	}
}

func TestValidateTenantDefaults(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name          string
		tenant        string
		subjectTenant string
		want          string
	}{
		{name: "from subject", subjectTenant: "acme", want: "acme"},
		{name: "default without subject", want: DefaultTenant},
		{name: "body tenant kept", tenant: "acme", want: "acme"},
		{name: "body equals subject", tenant: "acme", subjectTenant: "acme", want: "acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job := &Job{ID: "q1", Prompt: "hi", Tenant: tt.tenant}
			require.NoError(t, job.Validate(tt.subjectTenant, true))
			require.Equal(t, tt.want, job.Tenant)
		})
	}
}

func TestValidateNilJob(t *testing.T) {
	t.Parallel()
	var job *Job
	err := job.Validate("acme", true)
	require.ErrorIs(t, err, ErrInvalidJob)
}

func TestValidateErrorIsDeterministic(t *testing.T) {
	t.Parallel()
	// Two bad env values: the error must always name the first in key order.
	for range 20 {
		job := &Job{ID: "q1", Prompt: "hi", Options: Options{Env: map[string]string{"B": "\x00", "A": "\x00", "C": "\x00"}}}
		var ve *ValidationError
		require.True(t, errors.As(job.Validate("", true), &ve))
		require.Equal(t, "options.env.A", ve.Field)
	}
}

func TestValidTenantAndID(t *testing.T) {
	t.Parallel()
	require.True(t, ValidTenant("a"))
	require.True(t, ValidTenant("a0_-"))
	require.False(t, ValidTenant(""))
	require.False(t, ValidTenant("_a"))
	require.False(t, ValidTenant("a\n"))
	require.True(t, ValidID("Q1-b_c"))
	require.False(t, ValidID(""))
	require.False(t, ValidID("q1\n"))
	require.False(t, ValidID("q 1"))
}
