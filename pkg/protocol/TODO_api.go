package protocol

// This file lists the API the protocol helper implements. Each declaration
// moves to its real file (codec.go, validate.go, message.go, reader.go,
// synthetic.go) when implemented, and this file is deleted.

import (
	"encoding/json"
	"io"
	"regexp"
)

var (
	tenantRE = regexp.MustCompile(TenantPattern)
	idRE     = regexp.MustCompile(IDPattern)
)

// ValidTenant reports whether s matches TenantPattern.
func ValidTenant(s string) bool { return tenantRE.MatchString(s) }

// ValidID reports whether s matches IDPattern.
func ValidID(s string) bool { return idRE.MatchString(s) }

// DecodeJob decodes a job body with the codec chosen by contentType
// ("" or application/json → JSON; application/msgpack → msgpack). It does not
// validate. On a decode error it returns what it could read (possibly with ID
// and Tenant set) together with an error wrapping ErrInvalidJob.
func DecodeJob(contentType string, data []byte) (*Job, error) { panic("TODO") }

// Validate checks every SPEC 3.1 rule. subjectTenant is the tenant taken from
// the subject (or "" when the job arrived by another route); requireID says
// whether id is required (true on direct publish). It fills Tenant from
// subjectTenant (or DefaultTenant) when empty. Errors are *ValidationError.
func (j *Job) Validate(subjectTenant string, requireID bool) error { panic("TODO") }

// Message is one agent stdout line, kept byte-for-byte, with a parsed header.
type Message struct {
	Raw             []byte // the exact line, without its line terminator
	Type            string // "" when the line is not a JSON object
	Subtype         string
	UUID            string
	SessionID       string
	ParentToolUseID *string
	JSON            bool // the line is a JSON object
}

// ParseMessage parses the small header of a line. It never fails: a line that
// is not a JSON object gives a Message with JSON false. Raw aliases line.
func ParseMessage(line []byte) Message { panic("TODO") }

// IsResult reports whether the message is a "result" line.
func (m Message) IsResult() bool { return m.Type == "result" }

// Result is the typed view of a result line.
type Result struct {
	Subtype        string          `json:"subtype"`
	IsError        bool            `json:"is_error"`
	Result         *string         `json:"result,omitempty"`
	Errors         []string        `json:"errors,omitempty"`
	NumTurns       int             `json:"num_turns"`
	DurationMS     int64           `json:"duration_ms"`
	TotalCostUSD   float64         `json:"total_cost_usd"`
	SessionID      string          `json:"session_id"`
	TerminalReason string          `json:"terminal_reason,omitempty"`
	Usage          json.RawMessage `json:"usage,omitempty"`
	XFleet         *XFleet         `json:"x_fleet,omitempty"`
}

// AsResult decodes the result view; error if the line is not a result.
func (m Message) AsResult() (*Result, error) { panic("TODO") }

// XFleet is the extension object of a synthetic result.
type XFleet struct {
	Synthetic  bool   `json:"synthetic"`
	Reason     string `json:"reason"`
	ExitCode   *int   `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	StderrTail string `json:"stderr_tail,omitempty"`
}

// Synthetic result reasons.
const (
	ReasonCancelled      = "cancelled"
	ReasonTimeout        = "timeout"
	ReasonProcessExit    = "process_exit"
	ReasonSpawnFailed    = "spawn_failed"
	ReasonOutputTooLarge = "output_too_large"
)

// SyntheticInput describes why a run ended without a result.
type SyntheticInput struct {
	Reason     string
	ExitCode   *int
	Signal     string
	StderrTail string
	DurationMS int64
	SessionID  string
	NumTurns   int
	Message    string // human-readable, goes in errors[0]
}

// SyntheticResult returns the line (no trailing newline) of SPEC 3.3.
func SyntheticResult(in SyntheticInput) []byte { panic("TODO") }

// DefaultMaxLine is the default line cap of LineReader (64 MiB).
const DefaultMaxLine = 64 << 20

// LineReader reads stdout lines without ever stalling the writer.
type LineReader struct{}

// NewLineReader returns a reader with the given cap (<=0 → DefaultMaxLine).
func NewLineReader(r io.Reader, maxLine int) *LineReader { panic("TODO") }

// Next returns the next line without its terminator (\n or \r\n). The slice is
// valid until the next call. A line over the cap is replaced by a marker line
// {"type":"x_fleet_line_too_large","bytes":N,"cap":C}. At EOF a final line
// without newline is returned, then io.EOF.
func (r *LineReader) Next() ([]byte, error) { panic("TODO") }

// Oversized is how many lines were replaced by a marker.
func (r *LineReader) Oversized() int { panic("TODO") }
