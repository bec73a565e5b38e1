package protocol

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestToolEventsReadsUsesAndResults(t *testing.T) {
	t.Parallel()
	use := []byte(`{"type":"assistant","message":{"content":[{"type":"text","text":"x"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},"session_id":"s"}`)
	uses, res := ToolEvents(ParseMessage(use))
	require.Equal(t, []ToolUse{{ID: "toolu_1", Name: "Bash"}}, uses)
	require.Empty(t, res)
	result := []byte(`{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"boom","is_error":true}]}}`)
	uses, res = ToolEvents(ParseMessage(result))
	require.Empty(t, uses)
	require.Equal(t, []ToolResult{{ToolUseID: "toolu_1", IsError: true}}, res)
	// A user prompt that merely mentions the word is no result.
	uses, res = ToolEvents(ParseMessage([]byte(`{"type":"user","message":{"content":"what is a \"tool_result\"?"}}`)))
	require.Empty(t, uses)
	require.Empty(t, res)
}

func FuzzToolEvents(f *testing.F) {
	f.Add([]byte(`{"type":"assistant","message":{"content":[{"type":"tool_use","id":"a","name":"B"}]}}`))
	f.Add([]byte(`{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"a","is_error":true}]}}`))
	f.Add([]byte(`{"type":"user","message":{"content":"tool_result"}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		uses, res := ToolEvents(ParseMessage(line))
		for _, u := range uses {
			if u.ID == "" {
				t.Fatal("a tool use without an id")
			}
		}
		for _, r := range res {
			if r.ToolUseID == "" {
				t.Fatal("a tool result without an id")
			}
		}
	})
}
