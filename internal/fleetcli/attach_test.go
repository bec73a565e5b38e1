package fleetcli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func newTestPrompter(pending ...string) (*prompter, *bytes.Buffer) {
	var buf bytes.Buffer
	p := &prompter{w: &buf}
	for _, id := range pending {
		p.line([]byte(`{"type":"control_request","request_id":"` + id + `","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"}}}`))
	}
	return p, &buf
}

// TestAttachParse: typed lines become inputs unless a permission request
// waits and the line answers it; /allow and /deny name a request or take
// the oldest.
func TestAttachParse(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	for name, tc := range map[string]struct {
		pending []string
		line    string
		op      string
		req     protocol.SessionOpRequest
		err     string
	}{
		"text":                    {line: "hello there", op: protocol.OpInput, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{Text: "hello there"}}},
		"y without a request":     {line: "y", op: protocol.OpInput, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{Text: "y"}}},
		"y answers the oldest":    {pending: []string{"r1", "r2"}, line: "y", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r1", Allow: &yes}}},
		"YES":                     {pending: []string{"r1"}, line: "YES", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r1", Allow: &yes}}},
		"no with a message":       {pending: []string{"r1"}, line: "no  not on main", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r1", Allow: &no, Message: "not on main"}}},
		"other text while asked":  {pending: []string{"r1"}, line: "yes please, and then x", op: protocol.OpInput, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{Text: "yes please, and then x"}}},
		"/allow names one":        {pending: []string{"r1", "r2"}, line: "/allow r2", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r2", Allow: &yes}}},
		"/deny oldest with why":   {pending: []string{"r1", "r2"}, line: "/deny too risky", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r1", Allow: &no, Message: "too risky"}}},
		"/deny names one, why":    {pending: []string{"r1", "r2"}, line: "/deny r2 too risky", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "r2", Allow: &no, Message: "too risky"}}},
		"/allow an unseen id":     {line: "/allow req_9", op: protocol.OpApprove, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{RequestID: "req_9", Allow: &yes}}},
		"/allow nothing waiting":  {line: "/allow", err: "no permission request is waiting"},
		"/allow with a message":   {pending: []string{"r1"}, line: "/allow r1 because", err: "takes a request_id only"},
		"/interrupt":              {line: "/interrupt", op: protocol.OpInterrupt},
		"/end":                    {pending: []string{"r1"}, line: "/end", op: protocol.OpEnd},
		"other slash is an input": {line: "/compact", op: protocol.OpInput, req: protocol.SessionOpRequest{SessionOp: protocol.SessionOp{Text: "/compact"}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := newTestPrompter(tc.pending...)
			op, req, err := p.parse(tc.line)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.op, op)
			require.Equal(t, tc.req, req)
		})
	}
}

// TestAttachPrompts: the oldest request is prompted once with its tool,
// input and id; later ones are announced as queued; an answer prompts the
// next; a result line or a cancel clears them.
func TestAttachPrompts(t *testing.T) {
	t.Parallel()
	p, out := newTestPrompter("r1", "r2")
	s := out.String()
	require.Equal(t, 1, strings.Count(s, "? permission request"))
	require.Contains(t, s, `? permission request r1: the agent wants to use Bash {"command":"ls"}`)
	require.Contains(t, s, "(queued: permission request r2 for Bash")
	p.status(protocol.StatusEvent{State: protocol.StateAwaitingApproval, SessionStatus: protocol.SessionStatus{RequestID: "r1", ToolName: "Bash"}})
	require.Equal(t, 1, strings.Count(out.String(), "? permission request"), "a status for a prompted request prompts nothing")
	p.answered("r1")
	require.Contains(t, out.String(), "? permission request r2: the agent wants to use Bash")
	p.line([]byte(`{"type":"control_cancel_request","request_id":"r2"}`))
	require.Empty(t, p.pending)
	p.line([]byte(`{"type":"control_request","request_id":"r3","request":{"subtype":"can_use_tool","tool_name":"Write","input":{"file_path":"` + strings.Repeat("x", 500) + `"}}}`))
	require.Contains(t, out.String(), "…\n", "a long input is cut short")
	p.line([]byte(`{"type":"result","subtype":"success","is_error":false}`))
	require.Empty(t, p.pending, "a turn's end ends its requests")
}

// FuzzAttachLine: any typed line maps to a valid op or a clear error;
// approvals always name a request and an answer, inputs carry the line.
func FuzzAttachLine(f *testing.F) {
	for _, s := range []string{"y", "n no", "/allow", "/deny r1 why", "/allow r1", "/end", "/interrupt", "hello", "/x", "NO", "yes"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, line string, waiting bool) {
		line = strings.TrimSpace(line)
		if line == "" {
			return
		}
		var p *prompter
		if waiting {
			p, _ = newTestPrompter("r1")
		} else {
			p, _ = newTestPrompter()
		}
		op, req, err := p.parse(line)
		if err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		switch op {
		case protocol.OpApprove:
			require.NotEmpty(t, req.RequestID)
			require.NotNil(t, req.Allow)
		case protocol.OpInput:
			require.Equal(t, line, req.Text)
		case protocol.OpInterrupt, protocol.OpEnd:
		default:
			t.Fatalf("unknown op %q", op)
		}
	})
}

// FuzzPrompterLine: whatever lines the session streams, attach's prompter
// never panics, never keeps a request without an id, and keeps each id
// once.
func FuzzPrompterLine(f *testing.F) {
	f.Add([]byte(`{"type":"control_request","request_id":"r1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"}}}`), []byte(`{"type":"control_cancel_request","request_id":"r1"}`))
	f.Add([]byte(`{"type":"control_request","request_id":"r1","request":{"subtype":"can_use_tool","input":"x"}}`), []byte(`{"type":"control_response","response":{"request_id":"r1"}}`))
	f.Add([]byte(`{"type":"result"}`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var out bytes.Buffer
		p := &prompter{w: &out}
		for _, l := range [][]byte{a, b, a} {
			p.line(l)
		}
		seen := map[string]bool{}
		for _, r := range p.pending {
			require.NotEmpty(t, r.id)
			require.False(t, seen[r.id])
			seen[r.id] = true
		}
	})
}
