package protocol

import (
	"bytes"
	"encoding/json"
)

// ToolUse is one tool_use block of an assistant line: the agent asks for
// a tool call.
type ToolUse struct {
	ID   string
	Name string
}

// ToolResult is one tool_result block of a user line: a tool call ended.
type ToolResult struct {
	ToolUseID string
	IsError   bool
}

// toolLine is the part of an assistant or user line ToolEvents reads.
type toolLine struct {
	Message struct {
		Content json.RawMessage `json:"content"`
	} `json:"message"`
}

type toolBlock struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	Name      string `json:"name"`
	ToolUseID string `json:"tool_use_id"`
	IsError   bool   `json:"is_error"`
}

var (
	toolUseMark    = []byte(`"tool_use"`)
	toolResultMark = []byte(`"tool_result"`)
)

// ToolEvents returns the tool calls an agent line starts (tool_use blocks
// of an assistant line) and ends (tool_result blocks of a user line).
// Lines of other types, and lines that do not parse, give none. A line
// without the words is not decoded.
func ToolEvents(m Message) (uses []ToolUse, results []ToolResult) {
	switch m.Type {
	case TypeAssistant:
		if !bytes.Contains(m.Raw, toolUseMark) {
			return nil, nil
		}
	case TypeUser:
		if !bytes.Contains(m.Raw, toolResultMark) {
			return nil, nil
		}
	default:
		return nil, nil
	}
	var l toolLine
	if json.Unmarshal(m.Raw, &l) != nil || len(l.Message.Content) == 0 || l.Message.Content[0] != '[' {
		return nil, nil
	}
	var blocks []toolBlock
	if json.Unmarshal(l.Message.Content, &blocks) != nil {
		return nil, nil
	}
	for _, b := range blocks {
		switch {
		case m.Type == TypeAssistant && b.Type == "tool_use" && b.ID != "":
			uses = append(uses, ToolUse{ID: b.ID, Name: b.Name})
		case m.Type == TypeUser && b.Type == "tool_result" && b.ToolUseID != "":
			results = append(results, ToolResult{ToolUseID: b.ToolUseID, IsError: b.IsError})
		}
	}
	return uses, results
}
