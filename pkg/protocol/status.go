package protocol

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// State is a query's lifecycle state.
type State string

// The lifecycle states (docs/protocol.md).
const (
	StateQueued    State = "queued"
	StateRunning   State = "running"
	StateRetrying  State = "retrying"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
	// Session states (docs/sessions.md): the process waits for input, waits for an
	// approval, or is parked (no process, no slot).
	StateIdle             State = "idle"
	StateAwaitingApproval State = "awaiting_approval"
	StateParked           State = "parked"
)

// Terminal reports whether s ends a query.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// Error codes carried in StatusEvent.Error.Code and API error replies.
const (
	CodeInvalidJob         = "invalid_job"         // the job failed validation; never retried
	CodeAgentError         = "agent_error"         // the agent's result had is_error:true
	CodeCancelled          = "cancelled"           // cancelled by a user
	CodeTimeout            = "timeout"             // options.timeout_s elapsed
	CodeProcessExit        = "process_exit"        // the agent exited or crashed without a result
	CodeSpawnFailed        = "spawn_failed"        // the agent could not be started
	CodeOutputTooLarge     = "output_too_large"    // the agent's output broke a hard limit
	CodeSandboxUnavailable = "sandbox_unavailable" // the sandbox provider failed (retryable)
	CodeMaxDeliveries      = "max_deliveries"      // the job was redelivered too often (dead letter)
	CodeNotFound           = "not_found"           // API: no such query
	CodeInternal           = "internal"            // anything else
	CodeBudget             = "budget"              // the model gateway stopped the run at a spend cap (docs/gateway.md)
	// CodeBridgeIncompatible: the Cloudflare bridge Worker lacks what the
	// worker uses (an older bridge); never retried: the bridge must be
	// upgraded. The message names both versions.
	CodeBridgeIncompatible = "bridge_incompatible"
	CodeStalled            = "stalled" // the agent wrote nothing for its stall timeout while a turn ran
)

// ErrorInfo is the error object of status events and API replies.
type ErrorInfo struct {
	Code    string `json:"code" msgpack:"code"`
	Message string `json:"message" msgpack:"message"`
}

// ResultSummary is what a status event says of the agent's final result line.
type ResultSummary struct {
	Subtype      string          `json:"subtype,omitempty" msgpack:"subtype,omitempty"`
	IsError      bool            `json:"is_error" msgpack:"is_error"`
	NumTurns     int             `json:"num_turns,omitempty" msgpack:"num_turns,omitempty"`
	DurationMS   int64           `json:"duration_ms,omitempty" msgpack:"duration_ms,omitempty"`
	TotalCostUSD float64         `json:"total_cost_usd,omitempty" msgpack:"total_cost_usd,omitempty"`
	SessionID    string          `json:"session_id,omitempty" msgpack:"session_id,omitempty"`
	Errors       []string        `json:"errors,omitempty" msgpack:"errors,omitempty"`
	Usage        json.RawMessage `json:"usage,omitempty" msgpack:"-"`
	Synthetic    bool            `json:"synthetic,omitempty" msgpack:"synthetic,omitempty"`
	Lines        uint64          `json:"lines,omitempty" msgpack:"lines,omitempty"`
	LastSeq      uint64          `json:"last_seq,omitempty" msgpack:"last_seq,omitempty"`
	// StderrTail is the end (at most MaxStatusStderrTail bytes) of the
	// agent's stderr when the run ended without a result of its own: what
	// the synthetic result's x_fleet.stderr_tail holds, often the whole
	// story (for example "--dangerously-skip-permissions cannot be used
	// with root/sudo privileges").
	StderrTail string `json:"stderr_tail,omitempty" msgpack:"stderr_tail,omitempty"`
}

// MaxStatusStderrTail is the most of the agent's stderr a status event
// carries (the synthetic result on the stream carries up to MaxStderrTail).
const MaxStatusStderrTail = 2 << 10

// StatusEvent is published on <prefix>.query.<tenant>.<id>.status and kept as
// the query's status record in storage.
type StatusEvent struct {
	V       int    `json:"v" msgpack:"v"`
	ID      string `json:"id" msgpack:"id"`
	Tenant  string `json:"tenant" msgpack:"tenant"`
	State   State  `json:"state" msgpack:"state"`
	Attempt int    `json:"attempt" msgpack:"attempt"`
	// JobSeq is the FLEET_JOBS stream sequence of the submission this event
	// belongs to (0 when not known, e.g. "queued" before the job is stored).
	// It tells a new submission of an id from an earlier one.
	JobSeq   uint64            `json:"job_seq,omitempty" msgpack:"job_seq,omitempty"`
	Worker   string            `json:"worker,omitempty" msgpack:"worker,omitempty"`
	At       time.Time         `json:"at" msgpack:"at"`
	Error    *ErrorInfo        `json:"error,omitempty" msgpack:"error,omitempty"`
	Result   *ResultSummary    `json:"result,omitempty" msgpack:"result,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty" msgpack:"metadata,omitempty"`
	// Workspace is set for jobs with a workspace: start_sha once checked
	// out ("running"), the capture's summary in the terminal status.
	Workspace *WorkspaceStatus `json:"workspace,omitempty" msgpack:"workspace,omitempty"`
	// Session fields (docs/sessions.md); see session.go.
	SessionStatus
	// Reason says why a queued job waits (ReasonFleetCap, ReasonTenantCap,
	// ReasonBudget, ReasonRateLimited); Position is its place in its
	// tenant's queue (1 = next), 0 when not known.
	Reason   string `json:"reason,omitempty" msgpack:"reason,omitempty"`
	Position int    `json:"position,omitempty" msgpack:"position,omitempty"`
	// Warm is set on "running" (docs/warm.md): whether the run took a warm
	// agent (true) or started its agent cold (false).
	Warm *bool `json:"warm,omitempty" msgpack:"warm,omitempty"`
	// Prompt is the start of the job's prompt (PromptPreview), on the
	// statuses the dispatcher's API and the workers publish, so that a
	// list shows what a query was asked and search finds it by its text.
	Prompt string `json:"prompt,omitempty" msgpack:"prompt,omitempty"`
	// Trigger is what started the job when the fleet did (a schedule).
	Trigger *Trigger `json:"trigger,omitempty" msgpack:"trigger,omitempty"`
	// TraceID is the run's OpenTelemetry trace id (32 hex digits), once
	// known: the producer's traceparent's, or the one the fleet started.
	TraceID string `json:"trace_id,omitempty" msgpack:"trace_id,omitempty"`
}

// PromptPreviewBytes bounds StatusEvent.Prompt.
const PromptPreviewBytes = 200

// PromptPreview is the start of prompt, at most PromptPreviewBytes, cut at
// a rune boundary, with "…" when cut.
func PromptPreview(prompt string) string {
	if len(prompt) <= PromptPreviewBytes {
		return prompt
	}
	cut := PromptPreviewBytes
	for cut > 0 && !utf8.RuneStart(prompt[cut]) {
		cut--
	}
	return prompt[:cut] + "…"
}

// SchemaVersion is the V of every envelope this code writes.
const SchemaVersion = 1

// Message headers (docs/protocol.md).
const (
	HeaderSeq         = "Fleet-Seq"
	HeaderAttempt     = "Fleet-Attempt"
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderContentType = "Content-Type"
	// HeaderReason carries a reason on dead letters.
	HeaderReason = "Fleet-Reason"
)

// LineMsgID is the Nats-Msg-Id of one relayed line:
// <tenant>.<id>.<attempt>.<seq>. The tenant is in it because JetStream
// dedupes per stream while ids are unique only within a tenant: without it
// two tenants' queries with the same id would drop each other's lines.
func LineMsgID(tenant, id string, attempt int, seq uint64) string {
	return tenant + "." + id + "." + strconv.Itoa(attempt) + "." + strconv.FormatUint(seq, 10)
}

// JobMsgID is the Nats-Msg-Id the dispatcher gives a job: <tenant>.<id>
// (dedupe per tenant; see LineMsgID).
func JobMsgID(tenant, id string) string { return tenant + "." + id }

// Content types understood by DecodeJob.
const (
	ContentTypeJSON    = "application/json"
	ContentTypeMsgpack = "application/msgpack"
)

// CtlOp is a control message on <prefix>.query.<tenant>.<id>.ctl.
type CtlOp struct {
	Op string `json:"op" msgpack:"op"`
	// Attempt is set on "fence": runs of earlier attempts must stop relaying.
	Attempt int `json:"attempt,omitempty" msgpack:"attempt,omitempty"`
	// Session ops (docs/sessions.md); see session.go.
	SessionOp
}

// Control operations.
const (
	OpCancel = "cancel"
	OpFence  = "fence"
)

// SubmitReply is the dispatcher's answer on <prefix>.api.submit.
type SubmitReply struct {
	ID       string         `json:"id,omitempty" msgpack:"id,omitempty"`
	Tenant   string         `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
	Subjects *QuerySubjects `json:"subjects,omitempty" msgpack:"subjects,omitempty"`
	// Duplicate is true when the same tenant and id were submitted within
	// the dedupe window: nothing new was queued.
	Duplicate bool       `json:"duplicate,omitempty" msgpack:"duplicate,omitempty"`
	Error     *ErrorInfo `json:"error,omitempty" msgpack:"error,omitempty"`
}

// QuerySubjects names a query's three subjects.
type QuerySubjects struct {
	Msg    string `json:"msg" msgpack:"msg"`
	Status string `json:"status" msgpack:"status"`
	Ctl    string `json:"ctl" msgpack:"ctl"`
}

// QueryRef names one query in API requests (cancel, status).
type QueryRef struct {
	ID     string `json:"id" msgpack:"id"`
	Tenant string `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
}

// APIReply is the generic answer of cancel, status and list.
type APIReply struct {
	OK      bool          `json:"ok,omitempty" msgpack:"ok,omitempty"`
	Status  *StatusEvent  `json:"status,omitempty" msgpack:"status,omitempty"`
	Queries []StatusEvent `json:"queries,omitempty" msgpack:"queries,omitempty"`
	Error   *ErrorInfo    `json:"error,omitempty" msgpack:"error,omitempty"`
	// DeadLetters answers a ListRequest with DeadLetters set, newest first.
	DeadLetters []DeadLetter `json:"dead_letters,omitempty" msgpack:"dead_letters,omitempty"`
}

// ListRequest asks the dispatcher for recent queries.
type ListRequest struct {
	Tenant string `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
	State  State  `json:"state,omitempty" msgpack:"state,omitempty"`
	Limit  int    `json:"limit,omitempty" msgpack:"limit,omitempty"`
	// DeadLetters lists the dead-letter stream instead of queries (State
	// does not apply).
	DeadLetters bool `json:"dead_letters,omitempty" msgpack:"dead_letters,omitempty"`
}
