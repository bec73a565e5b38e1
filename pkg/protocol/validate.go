package protocol

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits of a job (docs/protocol.md), enforced by (*Job).Validate and DecodeJob.
const (
	// MaxJobBytes is the largest encoded job body DecodeJob accepts (1 MiB).
	MaxJobBytes = 1 << 20
	// MaxTurnsLimit is the largest options.max_turns.
	MaxTurnsLimit = 10000
	// MaxBudgetUSDLimit is the largest options.max_budget_usd.
	MaxBudgetUSDLimit = 10000.0
	// MaxTimeoutS is the largest options.timeout_s (7 days).
	MaxTimeoutS = 7 * 24 * 3600
	// MaxToolEntries is the largest number of entries in allowed_tools or disallowed_tools.
	MaxToolEntries = 256
	// MaxEnvEntries is the largest number of entries in options.env.
	MaxEnvEntries = 64
	// MaxMetadataEntries is the largest number of entries in metadata.
	MaxMetadataEntries = 64
	// MaxMetadataKeyBytes is the longest metadata key.
	MaxMetadataKeyBytes = 128
	// MaxMetadataValueBytes is the longest metadata value (4 KiB).
	MaxMetadataValueBytes = 4 << 10
)

// Patterns of option values that end up on the agent's command line or in
// its environment. They are deliberately conservative: no value may start
// with '-', so none can be mistaken for a flag.
const (
	ModelPattern  = `^[A-Za-z0-9._:\[\]/,][A-Za-z0-9._:\[\]/,-]{0,127}$`
	ResumePattern = `^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`
	EnvKeyPattern = `^[A-Za-z_][A-Za-z0-9_]{0,127}$`
)

// Permission modes accepted in options.permission_mode (the CLI's --permission-mode values).
var permissionModes = []string{"default", "acceptEdits", "bypassPermissions", "plan", "dontAsk", "auto"}

var (
	tenantRE = regexp.MustCompile(TenantPattern)
	idRE     = regexp.MustCompile(IDPattern)
	modelRE  = regexp.MustCompile(ModelPattern)
	resumeRE = regexp.MustCompile(ResumePattern)
	envKeyRE = regexp.MustCompile(EnvKeyPattern)
)

// ValidTenant reports whether s matches TenantPattern.
func ValidTenant(s string) bool { return tenantRE.MatchString(s) }

// ValidID reports whether s matches IDPattern.
func ValidID(s string) bool { return idRE.MatchString(s) }

// Validate checks every rule of the job format (docs/protocol.md). subjectTenant is the tenant taken from
// the subject (or "" when the job arrived by another route); requireID says
// whether id is required (true on direct publish). It fills Tenant from
// subjectTenant (or DefaultTenant) when empty. Errors are *ValidationError.
//
// The first broken rule is reported, in this order: id, tenant, prompt,
// sandbox, options (field by field), max_cost_usd, session, metadata, workspace. Map entries are checked in
// sorted key order so the error is deterministic. The operator's env
// allow-list is not checked here: the worker enforces it.
func (j *Job) Validate(subjectTenant string, requireID bool) error {
	if j == nil {
		return invalid("body", "is missing")
	}
	if err := j.validateIdentity(subjectTenant, requireID); err != nil {
		return err
	}
	if err := checkText("prompt", j.Prompt, MaxPromptBytes); err != nil {
		return err
	}
	switch j.Sandbox {
	case "", SandboxLocal, SandboxCloudflare:
	default:
		return invalid("sandbox", fmt.Sprintf("must be %q or %q, got %s", SandboxLocal, SandboxCloudflare, quoteShort(j.Sandbox)))
	}
	if err := j.Options.validate(); err != nil {
		return err
	}
	if c := j.MaxCostUSD; c != nil && (math.IsNaN(*c) || math.IsInf(*c, 0) || *c <= 0 || *c > MaxBudgetUSDLimit) {
		return invalid("max_cost_usd", fmt.Sprintf("must be a finite number above 0 and at most %g, got %g", MaxBudgetUSDLimit, *c))
	}
	if err := validateSetup(j.Setup); err != nil {
		return err
	}
	if err := j.Limits.validate(); err != nil {
		return err
	}
	if err := j.Session.validate(); err != nil {
		return err
	}
	if err := validateMetadata(j.Metadata); err != nil {
		return err
	}
	if err := j.Trigger.validate(); err != nil {
		return err
	}
	return j.Workspace.validate()
}

func (j *Job) validateIdentity(subjectTenant string, requireID bool) error {
	switch {
	case j.ID == "" && requireID:
		return invalid("id", "is required")
	case j.ID != "" && !ValidID(j.ID):
		return invalid("id", fmt.Sprintf("must match %s, got %s", IDPattern, quoteShort(j.ID)))
	}
	if subjectTenant != "" && !ValidTenant(subjectTenant) {
		return invalid("subject", fmt.Sprintf("tenant %s does not match %s", quoteShort(subjectTenant), TenantPattern))
	}
	switch {
	case j.Tenant == "" && subjectTenant != "":
		j.Tenant = subjectTenant
	case j.Tenant == "":
		j.Tenant = DefaultTenant
	case !ValidTenant(j.Tenant):
		return invalid("tenant", fmt.Sprintf("must match %s, got %s", TenantPattern, quoteShort(j.Tenant)))
	case subjectTenant != "" && j.Tenant != subjectTenant:
		return invalid("tenant", fmt.Sprintf("must equal the subject's tenant %q, got %q", subjectTenant, j.Tenant))
	}
	return nil
}

func (o *Options) validate() error {
	if o.Model != "" && !modelRE.MatchString(o.Model) {
		return invalid("options.model", fmt.Sprintf("must match %s, got %s", ModelPattern, quoteShort(o.Model)))
	}
	if o.MaxTurns != nil && (*o.MaxTurns < 1 || *o.MaxTurns > MaxTurnsLimit) {
		return invalid("options.max_turns", fmt.Sprintf("must be between 1 and %d, got %d", MaxTurnsLimit, *o.MaxTurns))
	}
	if b := o.MaxBudgetUSD; b != nil && (math.IsNaN(*b) || math.IsInf(*b, 0) || *b <= 0 || *b > MaxBudgetUSDLimit) {
		return invalid("options.max_budget_usd", fmt.Sprintf("must be a finite number above 0 and at most %g, got %g", MaxBudgetUSDLimit, *b))
	}
	if o.PermissionMode != "" && !slices.Contains(permissionModes, o.PermissionMode) {
		return invalid("options.permission_mode", fmt.Sprintf("must be one of %s, got %s", strings.Join(permissionModes, ", "), quoteShort(o.PermissionMode)))
	}
	if err := validateTools("options.allowed_tools", o.AllowedTools); err != nil {
		return err
	}
	if err := validateTools("options.disallowed_tools", o.DisallowedTools); err != nil {
		return err
	}
	if o.SystemPrompt != nil {
		if err := checkString("options.system_prompt", *o.SystemPrompt, MaxPromptBytes); err != nil {
			return err
		}
	}
	if o.AppendSystemPrompt != nil {
		if err := checkString("options.append_system_prompt", *o.AppendSystemPrompt, MaxPromptBytes); err != nil {
			return err
		}
	}
	if o.Resume != "" && !resumeRE.MatchString(o.Resume) {
		return invalid("options.resume", fmt.Sprintf("must match %s, got %s", ResumePattern, quoteShort(o.Resume)))
	}
	if o.TimeoutS != nil && (*o.TimeoutS < 1 || *o.TimeoutS > MaxTimeoutS) {
		return invalid("options.timeout_s", fmt.Sprintf("must be between 1 and %d, got %d", MaxTimeoutS, *o.TimeoutS))
	}
	if _, err := o.StallTimeoutDuration(); err != nil {
		return err
	}
	return validateEnv(o.Env)
}

// StallTimeoutDuration is options.stall_timeout parsed (0 when not set).
// Errors are *ValidationError naming the field.
func (o *Options) StallTimeoutDuration() (time.Duration, error) {
	if o.StallTimeout == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(o.StallTimeout)
	switch {
	case err != nil:
		return 0, invalid("options.stall_timeout", fmt.Sprintf("must be a duration such as 90s or 10m, got %s", quoteShort(o.StallTimeout)))
	case d <= 0 || d > MaxTimeoutS*time.Second:
		return 0, invalid("options.stall_timeout", fmt.Sprintf("must be above 0 and at most %s, got %s", time.Duration(MaxTimeoutS)*time.Second, quoteShort(o.StallTimeout)))
	}
	return d, nil
}

func validateTools(field string, tools []string) error {
	if len(tools) > MaxToolEntries {
		return invalid(field, fmt.Sprintf("has %d entries, at most %d allowed", len(tools), MaxToolEntries))
	}
	for i, t := range tools {
		f := field + "[" + strconv.Itoa(i) + "]"
		switch {
		case t == "":
			return invalid(f, "must not be empty")
		case strings.HasPrefix(t, "-"):
			return invalid(f, "must not start with '-'")
		}
		if err := checkString(f, t, 0); err != nil {
			return err
		}
	}
	return nil
}

func validateEnv(env map[string]string) error {
	if len(env) > MaxEnvEntries {
		return invalid("options.env", fmt.Sprintf("has %d entries, at most %d allowed", len(env), MaxEnvEntries))
	}
	for _, k := range sortedKeys(env) {
		if !envKeyRE.MatchString(k) {
			return invalid("options.env", fmt.Sprintf("key %s must match %s", quoteShort(k), EnvKeyPattern))
		}
		if err := checkString("options.env."+k, env[k], 0); err != nil {
			return err
		}
	}
	return nil
}

func validateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return invalid("metadata", fmt.Sprintf("has %d entries, at most %d allowed", len(md), MaxMetadataEntries))
	}
	for _, k := range sortedKeys(md) {
		switch {
		case k == "":
			return invalid("metadata", "keys must not be empty")
		case len(k) > MaxMetadataKeyBytes:
			return invalid("metadata", fmt.Sprintf("key %s is %d bytes, at most %d allowed", quoteShort(k), len(k), MaxMetadataKeyBytes))
		case !utf8.ValidString(k):
			return invalid("metadata", fmt.Sprintf("key %s is not valid UTF-8", quoteShort(k)))
		}
		v := md[k]
		f := "metadata." + k
		if len(v) > MaxMetadataValueBytes {
			return invalid(f, fmt.Sprintf("is %d bytes, at most %d allowed", len(v), MaxMetadataValueBytes))
		}
		if !utf8.ValidString(v) {
			return invalid(f, "is not valid UTF-8")
		}
	}
	return nil
}

// checkText checks a required string that reaches the agent.
func checkText(field, s string, maxBytes int) error {
	if s == "" {
		return invalid(field, "is required and must not be empty")
	}
	return checkString(field, s, maxBytes)
}

// checkString checks a string that reaches the agent's arguments or
// environment: valid UTF-8, no NUL byte (exec cannot pass one) and, when
// maxBytes > 0, at most maxBytes long.
func checkString(field, s string, maxBytes int) error {
	switch {
	case maxBytes > 0 && len(s) > maxBytes:
		return invalid(field, fmt.Sprintf("is %d bytes, at most %d allowed", len(s), maxBytes))
	case !utf8.ValidString(s):
		return invalid(field, "is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "must not contain a NUL byte")
	}
	return nil
}

func invalid(field, reason string) *ValidationError {
	return &ValidationError{Field: field, Reason: reason}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// quoteShort quotes s for an error message, cut to 64 bytes so a hostile
// value cannot blow up logs.
func quoteShort(s string) string {
	const limit = 64
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:limit]) + "…"
}
