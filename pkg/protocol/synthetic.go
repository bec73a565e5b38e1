package protocol

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

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
	// ReasonStalled: the agent wrote no line for its stall timeout while a
	// turn ran, and was stopped.
	ReasonStalled = "stalled"
	// ReasonMaxDeliveries: the dispatcher dead-lettered the job after its
	// last attempt.
	ReasonMaxDeliveries = "max_deliveries"
	// ReasonBridgeIncompatible: the Cloudflare bridge Worker lacks what
	// the worker uses; the run never started (CodeBridgeIncompatible).
	ReasonBridgeIncompatible = "bridge_incompatible"
)

// MaxStderrTail is the most of SyntheticInput.StderrTail that goes into a
// synthetic result (its last 16 KiB), so the line always fits one NATS message.
const MaxStderrTail = 16 << 10

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

// syntheticLine fixes the key order of a synthetic result line.
type syntheticLine struct {
	Type              string          `json:"type"`
	Subtype           string          `json:"subtype"`
	IsError           bool            `json:"is_error"`
	DurationMS        int64           `json:"duration_ms"`
	DurationAPIMS     int64           `json:"duration_api_ms"`
	NumTurns          int             `json:"num_turns"`
	StopReason        *string         `json:"stop_reason"`
	SessionID         string          `json:"session_id"`
	TotalCostUSD      float64         `json:"total_cost_usd"`
	Usage             json.RawMessage `json:"usage"`
	ModelUsage        json.RawMessage `json:"modelUsage"` //nolint:tagliatelle // the CLI's own key
	PermissionDenials json.RawMessage `json:"permission_denials"`
	Errors            []string        `json:"errors"`
	TerminalReason    string          `json:"terminal_reason,omitempty"`
	UUID              string          `json:"uuid"`
	XFleet            syntheticXFleet `json:"x_fleet"`
}

type syntheticXFleet struct {
	Synthetic  bool    `json:"synthetic"`
	Reason     string  `json:"reason"`
	ExitCode   *int    `json:"exit_code"`
	Signal     *string `json:"signal"`
	StderrTail string  `json:"stderr_tail"`
}

var zeroUsage = json.RawMessage(`{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`)

// SyntheticResult returns the synthetic result line of docs/protocol.md
// (no trailing newline).
//
// The line has the shape of the SDK's error result: subtype
// error_during_execution, is_error true, zero cost and usage, errors[0] =
// in.Message (a default sentence naming the reason when empty), a fresh v4
// uuid, and an x_fleet object {synthetic, reason, exit_code, signal,
// stderr_tail} where exit_code and signal are null when unknown.
// terminal_reason "aborted_streaming" is added only for ReasonCancelled,
// mirroring what the CLI reports for an interrupt. An empty Reason means
// ReasonProcessExit. Strings are made valid UTF-8 (invalid bytes become
// U+FFFD) and StderrTail is cut to its last MaxStderrTail bytes.
func SyntheticResult(in SyntheticInput) []byte {
	if in.Reason == "" {
		in.Reason = ReasonProcessExit
	}
	msg := in.Message
	if msg == "" {
		msg = defaultSyntheticMessage(in)
	}
	line := syntheticLine{
		Type:              TypeResult,
		Subtype:           SubtypeErrorDuringExecution,
		IsError:           true,
		DurationMS:        max(in.DurationMS, 0),
		NumTurns:          max(in.NumTurns, 0),
		SessionID:         validUTF8(in.SessionID),
		Usage:             zeroUsage,
		ModelUsage:        json.RawMessage(`{}`),
		PermissionDenials: json.RawMessage(`[]`),
		Errors:            []string{validUTF8(msg)},
		UUID:              newUUIDv4(),
		XFleet: syntheticXFleet{
			Synthetic:  true,
			Reason:     validUTF8(in.Reason),
			ExitCode:   in.ExitCode,
			StderrTail: validUTF8(tail(in.StderrTail, MaxStderrTail)),
		},
	}
	if in.Reason == ReasonCancelled {
		line.TerminalReason = "aborted_streaming"
	}
	if in.Signal != "" {
		sig := validUTF8(in.Signal)
		line.XFleet.Signal = &sig
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Encode cannot fail here: the fields are strings, integers, a zero
	// float, bools and constant, valid raw JSON.
	_ = enc.Encode(line)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func defaultSyntheticMessage(in SyntheticInput) string {
	var what string
	switch in.Reason {
	case ReasonCancelled:
		what = "the run was cancelled"
	case ReasonTimeout:
		what = "the run timed out"
	case ReasonSpawnFailed:
		what = "the agent could not be started"
	case ReasonOutputTooLarge:
		what = "the agent's output exceeded a hard limit"
	case ReasonStalled:
		what = "the agent stalled (no output for its stall timeout)"
	case ReasonMaxDeliveries:
		what = "the job was dead-lettered after its last delivery"
	default:
		what = "the agent exited"
	}
	var detail []string
	if in.ExitCode != nil {
		detail = append(detail, "exit code "+strconv.Itoa(*in.ExitCode))
	}
	if in.Signal != "" {
		detail = append(detail, "signal "+in.Signal)
	}
	if len(detail) > 0 {
		what += " (" + strings.Join(detail, ", ") + ")"
	}
	return "worker: " + what + " before the agent wrote a result"
}

// tail returns the last n bytes of s, starting on a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for i := 0; i < utf8.UTFMax && i < len(s); i++ {
		if utf8.RuneStart(s[i]) {
			return s[i:]
		}
	}
	return s
}

func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// newUUIDv4 returns a random RFC 9562 version 4 UUID.
func newUUIDv4() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never returns an error
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}
