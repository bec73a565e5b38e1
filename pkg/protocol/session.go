package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"unicode/utf8"
)

// Session is a job's "session" object (docs/sessions.md): the job is a multi-turn
// session rather than one run.
type Session struct {
	// IdleTimeoutS parks the session after this many seconds with no turn
	// running, no input queued and no approval pending. Nil = the default
	// (DefaultIdleTimeoutS).
	IdleTimeoutS *int `json:"idle_timeout_s,omitempty" msgpack:"idle_timeout_s,omitempty"`
	// Approvals is ApprovalsNone or ApprovalsRemote ("" = none). Remote
	// relays the agent's permission requests and waits for "approve" ops.
	Approvals string `json:"approvals,omitempty" msgpack:"approvals,omitempty"`
	// Continuation is set by the dispatcher (not by producers) on the job it
	// enqueues to resume a parked session: the worker restores the query's
	// checkpoint instead of starting anew. A producer setting it can only
	// resume its own query (same tenant and id).
	Continuation bool `json:"continuation,omitempty" msgpack:"continuation,omitempty"`
}

// Session approval modes.
const (
	ApprovalsNone   = "none"
	ApprovalsRemote = "remote"
)

// DefaultIdleTimeoutS is session.idle_timeout_s when not set (5 minutes).
const DefaultIdleTimeoutS = 300

// IdleTimeout returns the idle timeout in seconds, defaulted.
func (s *Session) IdleTimeout() int {
	if s == nil || s.IdleTimeoutS == nil {
		return DefaultIdleTimeoutS
	}
	return *s.IdleTimeoutS
}

// RemoteApprovals reports whether permission requests go to the users.
func (s *Session) RemoteApprovals() bool { return s != nil && s.Approvals == ApprovalsRemote }

func (s *Session) validate() error {
	if s == nil {
		return nil
	}
	if s.IdleTimeoutS != nil && (*s.IdleTimeoutS < 1 || *s.IdleTimeoutS > MaxTimeoutS) {
		return invalid("session.idle_timeout_s", fmt.Sprintf("must be between 1 and %d, got %d", MaxTimeoutS, *s.IdleTimeoutS))
	}
	switch s.Approvals {
	case "", ApprovalsNone, ApprovalsRemote:
	default:
		return invalid("session.approvals", fmt.Sprintf("must be %q or %q, got %s", ApprovalsNone, ApprovalsRemote, quoteShort(s.Approvals)))
	}
	return nil
}

// CodeResumeNotFound: options.resume named no earlier query or session of
// the tenant with a checkpoint (another tenant's are never found).
const CodeResumeNotFound = "resume_not_found"

// HeaderQueuedAt is set by the admitter on an admitted job: when its
// submission was stored in FLEET_JOBS (RFC 3339, nanoseconds). A session
// reads its input log from then, so inputs published while the job waited
// for admission are applied too.
const HeaderQueuedAt = "Fleet-Queued-At"

// CodeCheckpointFailed: a session's checkpoint could not be stored (an idle
// status carries it; the session goes on, and a resume starts from the
// last checkpoint that was stored).
const CodeCheckpointFailed = "checkpoint_failed"

// Session control operations on .ctl (and as fleet.api.<op> requests).
const (
	OpInput     = "input"
	OpInterrupt = "interrupt"
	OpApprove   = "approve"
	OpEnd       = "end"
)

// SessionOp holds the fields of the session ops; it is embedded in CtlOp.
type SessionOp struct {
	// Text is an input's user message.
	Text string `json:"text,omitempty" msgpack:"text,omitempty"`
	// UUID optionally names an input (the stream-json uuid).
	UUID string `json:"uuid,omitempty" msgpack:"uuid,omitempty"`
	// RequestID is the control_request an approve answers.
	RequestID string `json:"request_id,omitempty" msgpack:"request_id,omitempty"`
	// Allow is an approve's answer; required on approve.
	Allow *bool `json:"allow,omitempty" msgpack:"allow,omitempty"`
	// Message is a deny's reason, shown to the model.
	Message string `json:"message,omitempty" msgpack:"message,omitempty"`
	// UpdatedInput replaces the tool's input on allow.
	UpdatedInput map[string]any `json:"updated_input,omitempty" msgpack:"updated_input,omitempty"`
}

// SessionStatus holds the session fields of a StatusEvent; it is embedded.
type SessionStatus struct {
	// Turn counts the session's turns that ended (results so far).
	Turn int `json:"turn,omitempty" msgpack:"turn,omitempty"`
	// RequestID and ToolName name the permission request an
	// awaiting_approval status waits for.
	RequestID string `json:"request_id,omitempty" msgpack:"request_id,omitempty"`
	ToolName  string `json:"tool_name,omitempty" msgpack:"tool_name,omitempty"`
	// ClaudeSessionID is the agent's session id (from its init line),
	// carried by idle and parked statuses.
	ClaudeSessionID string `json:"claude_session_id,omitempty" msgpack:"claude_session_id,omitempty"`
	// CtlSeq is, on parked, the FLEET_QUERIES sequence of the last .ctl
	// message the session had read: an input stored after it must resume
	// the session.
	CtlSeq uint64 `json:"ctl_seq,omitempty" msgpack:"ctl_seq,omitempty"`
	// Session marks every status a worker publishes for a session job
	// (docs/sessions.md), whatever its state; a one-shot query's statuses omit it.
	// It lets a reader of the last status tell a session, which takes
	// input, from a one-shot query, which does not.
	Session bool `json:"session,omitempty" msgpack:"session,omitempty"`
}

// Limits of session ops.
const (
	MaxCtlBytes       = MaxPromptBytes + 64<<10
	MaxRequestIDBytes = 256
	MaxMessageBytes   = 16 << 10
)

var uuidRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// DecodeCtlOp decodes and validates one .ctl message (JSON, or msgpack with
// that content type). Unknown ops are an error; so are ops missing their
// fields. Errors are *ValidationError.
func DecodeCtlOp(contentType string, data []byte) (CtlOp, error) {
	var op CtlOp
	codec, err := CodecFor(contentType)
	if err != nil {
		return op, invalid(HeaderContentType, fmt.Sprintf("unsupported content type %s", quoteShort(contentType)))
	}
	if len(data) > MaxCtlBytes {
		return op, invalid("body", fmt.Sprintf("is %d bytes, at most %d allowed", len(data), MaxCtlBytes))
	}
	if _, isJSON := codec.(JSON); isJSON {
		t := bytes.TrimLeft(data, " \t\r\n")
		if len(t) == 0 || t[0] != '{' {
			return op, invalid("body", "must be a JSON object")
		}
		if !utf8.Valid(data) {
			return op, invalid("body", "must be valid UTF-8")
		}
		if err := json.Unmarshal(data, &op); err != nil {
			return CtlOp{}, invalid("body", "does not decode: "+err.Error())
		}
	} else if err := codec.Unmarshal(data, &op); err != nil {
		return CtlOp{}, invalid("body", "does not decode: "+err.Error())
	}
	return op, op.Validate()
}

// Validate checks a control op's fields.
func (op *CtlOp) Validate() error {
	switch op.Op {
	case OpCancel, OpFence, OpInterrupt, OpEnd:
		return nil
	case OpInput:
		if op.Text == "" {
			return invalid("text", "is required")
		}
		if err := checkText("text", op.Text, MaxPromptBytes); err != nil {
			return err
		}
		if op.UUID != "" && !uuidRE.MatchString(op.UUID) {
			return invalid("uuid", fmt.Sprintf("must match %s, got %s", uuidRE, quoteShort(op.UUID)))
		}
		return nil
	case OpApprove:
		switch {
		case op.RequestID == "":
			return invalid("request_id", "is required")
		case len(op.RequestID) > MaxRequestIDBytes || !utf8.ValidString(op.RequestID):
			return invalid("request_id", "must be valid UTF-8 of at most 256 bytes")
		case op.Allow == nil:
			return invalid("allow", "is required (true or false)")
		}
		return checkString("message", op.Message, MaxMessageBytes)
	case "":
		return invalid("op", "is required")
	default:
		return invalid("op", fmt.Sprintf("must be one of cancel, input, interrupt, approve, end; got %s", quoteShort(op.Op)))
	}
}

// SessionOpRequest is a fleet.api.<op> request for a session op: the query
// plus the op's fields (the op is the subject's last token).
type SessionOpRequest struct {
	ID     string `json:"id" msgpack:"id"`
	Tenant string `json:"tenant,omitempty" msgpack:"tenant,omitempty"`
	SessionOp
}

// APISessionOp is the dispatcher request subject of a session op:
// <prefix>.api.<op> (input, interrupt, approve, end).
func (n Names) APISessionOp(op string) string { return n.p() + ".api." + op }
