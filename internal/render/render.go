// Package render prints agent messages and status events for people:
// assistant text, tool calls, tool results, then the result with cost, turns
// and duration. It reads only what it shows and never fails on a message it
// does not know (unknown types are skipped unless Verbose). With Color it
// marks results, tool calls, errors and status lines with ANSI colours.
package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Printer renders to W.
type Printer struct {
	W io.Writer
	// Verbose also prints message types it does not render specially.
	Verbose bool
	// Color adds ANSI colours (the caller decides: a terminal, NO_COLOR).
	Color bool
}

// ANSI SGR codes.
const (
	red    = "31"
	green  = "32"
	yellow = "33"
	cyan   = "36"
	dim    = "2"
)

// paint wraps s in colour c when p.Color.
func (p *Printer) paint(c, s string) string {
	if !p.Color {
		return s
	}
	return "\x1b[" + c + "m" + s + "\x1b[0m"
}

type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	ToolUseID string          `json:"tool_use_id"`
}

type envelope struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	Model   string `json:"model"`
	Tools   []any  `json:"tools"`
	Message struct {
		Content json.RawMessage `json:"content"`
	} `json:"message"`
	ParentToolUseID *string `json:"parent_tool_use_id"`
	// x_fleet_large_line
	Seq   uint64 `json:"seq"`
	Bytes int64  `json:"bytes"`
	Key   string `json:"key"`
}

// Line renders one agent stdout line.
func (p *Printer) Line(line []byte) {
	msg := protocol.ParseMessage(line)
	if !msg.JSON {
		if p.Verbose {
			fmt.Fprintf(p.W, "  | %s\n", clip(string(line), 300))
		}
		return
	}
	var e envelope
	_ = json.Unmarshal(line, &e)
	indent := ""
	if e.ParentToolUseID != nil && *e.ParentToolUseID != "" {
		indent = "    "
	}
	switch msg.Type {
	case "system":
		if msg.Subtype == "init" {
			fmt.Fprintf(p.W, "● session %s · model %s · %d tools\n", msg.SessionID, e.Model, len(e.Tools))
		} else if p.Verbose {
			fmt.Fprintf(p.W, "  [system/%s]\n", msg.Subtype)
		}
	case "assistant":
		for _, b := range blocks(e.Message.Content) {
			switch b.Type {
			case "text":
				fmt.Fprintf(p.W, "%s%s\n", indent, strings.TrimRight(b.Text, "\n"))
			case "tool_use":
				fmt.Fprintf(p.W, "%s%s %s\n", indent, p.paint(cyan, "→ "+b.Name), clip(compact(b.Input), 200))
			case "thinking", "redacted_thinking":
				fmt.Fprintf(p.W, "%s%s\n", indent, p.paint(dim, "(thinking…)"))
			default:
				if p.Verbose {
					fmt.Fprintf(p.W, "%s[%s]\n", indent, b.Type)
				}
			}
		}
	case "user":
		for _, b := range blocks(e.Message.Content) {
			if b.Type != "tool_result" {
				continue
			}
			mark := p.paint(dim, "←")
			if b.IsError {
				mark = p.paint(red, "← error:")
			}
			fmt.Fprintf(p.W, "%s%s %s\n", indent, mark, clip(resultText(b.Content), 300))
		}
	case "result":
		p.result(msg)
	case "x_fleet_large_line":
		fmt.Fprintf(p.W, "  [line %d: %d bytes, too large for NATS; stored at %s]\n", e.Seq, e.Bytes, e.Key)
	case "x_fleet_line_too_large":
		fmt.Fprintf(p.W, "  [a line over the worker's line cap was dropped]\n")
	default:
		if p.Verbose {
			fmt.Fprintf(p.W, "  [%s]\n", msg.Type)
		}
	}
}

func (p *Printer) result(msg protocol.Message) {
	r, err := msg.AsResult()
	if err != nil {
		fmt.Fprintf(p.W, "%s %v\n", p.paint(red, "✗ unreadable result:"), err)
		return
	}
	stats := fmt.Sprintf("turns %d · cost $%.4f · %.1fs", r.NumTurns, r.TotalCostUSD, float64(r.DurationMS)/1000)
	if !r.IsError {
		fmt.Fprintf(p.W, "%s · %s\n", p.paint(green, "✓ done"), stats)
		return
	}
	fmt.Fprintf(p.W, "%s · %s\n", p.paint(red, "✗ "+outcome(r)), stats)
	for _, e := range r.Errors {
		fmt.Fprintf(p.W, "  %s\n", clip(e, 500))
	}
	if r.Result != nil && *r.Result != "" && len(r.Errors) == 0 {
		fmt.Fprintf(p.W, "  %s\n", clip(*r.Result, 500))
	}
	if r.XFleet != nil {
		p.StderrTail(r.XFleet.StderrTail)
	}
}

// stderrLines is how many of the last lines of the agent's stderr
// StderrTail shows.
const stderrLines = 12

// StderrTail shows the last lines of the agent's stderr, when there are any:
// why a run that ended without a result of its own failed.
func (p *Printer) StderrTail(tail string) {
	tail = strings.TrimRight(tail, "\n\r\t ")
	if strings.TrimSpace(tail) == "" {
		return
	}
	lines := strings.Split(tail, "\n")
	head := "  agent stderr:"
	if len(lines) > stderrLines {
		lines = lines[len(lines)-stderrLines:]
		head = fmt.Sprintf("  agent stderr (last %d lines):", stderrLines)
	}
	fmt.Fprintln(p.W, p.paint(red, head))
	for _, l := range lines {
		fmt.Fprintf(p.W, "  %s %s\n", p.paint(dim, "|"), clip(strings.TrimRight(l, "\r"), 300))
	}
}

// outcome names how an error result ended: the worker's reason for a
// synthetic one (a cancel is not a failure), else the agent's subtype; an
// is_error result whose subtype is "success" is the agent reporting an
// error (e.g. the model API failed), which the text after it explains.
func outcome(r *protocol.Result) string {
	if r.XFleet != nil && r.XFleet.Synthetic {
		switch r.XFleet.Reason {
		case protocol.ReasonCancelled:
			return "cancelled"
		case protocol.ReasonTimeout:
			return "timed out (options.timeout_s)"
		}
		return "failed (worker: " + r.XFleet.Reason + ")"
	}
	switch r.Subtype {
	case "", "success":
		return "failed (the agent reported an error)"
	case "error_max_turns":
		return "failed (max turns reached)"
	case "error_max_budget_usd":
		return "failed (budget reached)"
	}
	return "failed (" + r.Subtype + ")"
}

// Status renders one status event.
func (p *Printer) Status(ev protocol.StatusEvent) {
	s := fmt.Sprintf("[status] %s", ev.State)
	if ev.Attempt > 0 {
		s += fmt.Sprintf(" · attempt %d", ev.Attempt)
	}
	if ev.Worker != "" {
		s += " · " + ev.Worker
	}
	if ev.Error != nil {
		s += fmt.Sprintf(" · %s: %s", ev.Error.Code, clip(ev.Error.Message, 300))
	}
	s += workspaceStatus(ev.Workspace)
	c := dim
	switch ev.State {
	case protocol.StateSucceeded:
		c = green
	case protocol.StateFailed:
		c = red
	case protocol.StateCancelled, protocol.StateRetrying:
		c = yellow
	}
	fmt.Fprintln(p.W, p.paint(c, s))
}

func blocks(raw json.RawMessage) []block {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		return []block{{Type: "text", Text: s}}
	}
	var bs []block
	_ = json.Unmarshal(raw, &bs)
	return bs
}

func resultText(raw json.RawMessage) string {
	var parts []string
	for _, b := range blocks(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, " ")
}

func compact(raw json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw)
	}
	return buf.String()
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ⏎ ")
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) > n {
		r = r[:n]
	}
	return string(r) + "…"
}
