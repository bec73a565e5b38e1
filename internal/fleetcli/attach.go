package fleetcli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// attachCmd follows a session and turns each typed line into an input;
// the agent's permission requests are shown as prompts and answered there.
type attachCmd struct {
	tenant, id string
	render     renderFlags
}

func (c *attachCmd) Help() Help {
	return Help{
		Name: "attach", Args: "<id>",
		Summary: "follow a session; each line typed is an input, permission requests are prompts",
		Description: `Renders the session's output (its history, then live) and reads lines from
stdin: each line is sent as an input.

When the agent asks to use a tool (a session with --approvals remote), a
prompt on stderr names the tool, its input and the request id. While
requests wait, the oldest is answered by typing
  y | yes                  allow it (the whole line)
  n | no [message]         deny it (the message tells the model why)
and the next one is prompted. /allow [request_id] and /deny [request_id]
[message] answer a given request (the oldest without an id). /interrupt
ends the running turn, /end ends the session after it. Any other line,
including other /commands (Claude Code's own, such as /compact), is an
input. Exits when the session ends, or on Ctrl-C (the
session goes on).`,
		Examples: `dispatcher attach s1`,
	}
}

func (c *attachCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	c.render.add(fs)
}

func (c *attachCmd) Validate(fs *pflag.FlagSet) error {
	if err := oneID(fs, c.tenant); err != nil {
		return err
	}
	c.id = fs.Arg(0)
	return c.render.validate(true)
}

func (c *attachCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr := &prompter{w: e.Err}
	go func() {
		sc := bufio.NewScanner(e.In)
		sc.Buffer(nil, protocol.MaxCtlBytes)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			op, req, err := pr.parse(line)
			if err != nil {
				fmt.Fprintln(e.Err, err)
				continue
			}
			req.ID, req.Tenant = c.id, c.tenant
			if sessionOp(ctx, e, op, req) == ExitOK && op == protocol.OpApprove {
				pr.answered(req.RequestID)
			}
		}
	}()
	return follow(ctx, e, cl, c.tenant, c.id, true, c.render, followHooks{Line: pr.line, Status: pr.status})
}

// pendingRequest is a permission request the agent waits on.
type pendingRequest struct {
	id, tool string
	input    json.RawMessage
}

// prompter keeps the permission requests attach has seen unanswered, in
// the order they came, and prompts for the oldest.
type prompter struct {
	w io.Writer

	mu       sync.Mutex
	pending  []pendingRequest
	prompted string // the request the last prompt was for
}

// line notes permission requests, and what ends them: a cancel or an
// echoed answer of the agent, or the end of the turn (a result line).
func (p *prompter) line(raw []byte) {
	if req, ok := session.ParseRequest(raw); ok {
		p.mu.Lock()
		p.addLocked(pendingRequest{id: req.RequestID, tool: req.ToolName, input: req.Input})
		p.mu.Unlock()
		return
	}
	msg := protocol.ParseMessage(raw)
	switch {
	case msg.IsResult():
		p.mu.Lock()
		p.pending, p.prompted = nil, ""
		p.mu.Unlock()
	case msg.Type == "control_cancel_request" || msg.Type == "control_response":
		var m struct {
			RequestID string `json:"request_id"`
			Response  struct {
				RequestID string `json:"request_id"`
			} `json:"response"`
		}
		if json.Unmarshal(raw, &m) == nil {
			p.answered(m.RequestID)
			p.answered(m.Response.RequestID)
		}
	}
}

// status prompts for a request that a status names, should its line not
// have been seen (the status carries no input).
func (p *prompter) status(ev protocol.StatusEvent) {
	if ev.State != protocol.StateAwaitingApproval || ev.RequestID == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addLocked(pendingRequest{id: ev.RequestID, tool: ev.ToolName})
}

// addLocked notes a request (once) and prompts for it if it is the oldest;
// one that must wait for an earlier answer is announced on one line.
func (p *prompter) addLocked(r pendingRequest) {
	if i := slices.IndexFunc(p.pending, func(q pendingRequest) bool { return q.id == r.id }); i >= 0 {
		// The status came first (it carries no input); the line has it.
		if len(p.pending[i].input) == 0 && len(r.input) > 0 {
			p.pending[i].input = r.input
			if p.prompted == r.id {
				fmt.Fprintf(p.w, "\n  %s input:%s\n  allow? [y / n [message]] ", cmp.Or(r.tool, "the tool's"), shortInput(r.input))
			}
		}
		return
	}
	p.pending = append(p.pending, r)
	if len(p.pending) > 1 && p.prompted != "" {
		fmt.Fprintf(p.w, "\n  (queued: permission request %s for %s; answer the one above first)\n  allow? [y / n [message]] ",
			r.id, cmp.Or(r.tool, "a tool"))
		return
	}
	p.promptLocked()
}

// answered drops a request and prompts for the next.
func (p *prompter) answered(id string) {
	if id == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = slices.DeleteFunc(p.pending, func(r pendingRequest) bool { return r.id == id })
	if p.prompted == id {
		p.prompted = ""
	}
	p.promptLocked()
}

// promptLocked shows the prompt for the oldest request, once.
func (p *prompter) promptLocked() {
	if len(p.pending) == 0 || p.prompted == p.pending[0].id {
		return
	}
	r := p.pending[0]
	p.prompted = r.id
	more := ""
	if n := len(p.pending) - 1; n > 0 {
		more = fmt.Sprintf(" (%d more waiting)", n)
	}
	fmt.Fprintf(p.w, "\n? permission request %s%s: the agent wants to use %s%s\n  allow? [y / n [message]] ",
		r.id, more, cmp.Or(r.tool, "a tool"), shortInput(r.input))
}

// parse maps one typed line to a session op. While requests wait, a line
// of just y/yes, or n/no [message], answers the oldest; /allow and /deny take an optional
// request id.
func (p *prompter) parse(line string) (string, protocol.SessionOpRequest, error) {
	var req protocol.SessionOpRequest
	p.mu.Lock()
	oldest := ""
	if len(p.pending) > 0 {
		oldest = p.pending[0].id
	}
	known := func(id string) bool {
		return slices.ContainsFunc(p.pending, func(r pendingRequest) bool { return r.id == id })
	}
	p.mu.Unlock()
	f := strings.Fields(line)
	word := strings.ToLower(f[0])
	if oldest != "" && !strings.HasPrefix(line, "/") {
		allow := word == "y" || word == "yes"
		if (allow && len(f) == 1) || word == "n" || word == "no" {
			req.RequestID, req.Allow = oldest, &allow
			if !allow {
				req.Message = strings.TrimSpace(strings.TrimPrefix(line, f[0]))
			}
			return protocol.OpApprove, req, nil
		}
	}
	if !strings.HasPrefix(line, "/") {
		req.Text = line
		return protocol.OpInput, req, nil
	}
	switch f[0] {
	case "/interrupt":
		return protocol.OpInterrupt, req, nil
	case "/end":
		return protocol.OpEnd, req, nil
	case "/allow", "/deny":
		allow := f[0] == "/allow"
		req.Allow = &allow
		rest := f[1:]
		switch {
		case len(rest) > 0 && (known(rest[0]) || oldest == ""):
			req.RequestID, rest = rest[0], rest[1:]
		case oldest != "":
			req.RequestID = oldest
		default:
			return "", req, fmt.Errorf("%s: no permission request is waiting; name one: %s <request_id>", f[0], f[0])
		}
		req.Message = strings.Join(rest, " ")
		if allow && req.Message != "" {
			return "", req, fmt.Errorf("/allow takes a request_id only, not %q", req.Message)
		}
		return protocol.OpApprove, req, nil
	}
	// Any other line is the agent's (Claude Code's own slash commands,
	// such as /compact, are user messages too).
	req.Text = line
	return protocol.OpInput, req, nil
}

// shortInput renders a tool's input on one short line.
func shortInput(in json.RawMessage) string {
	if len(in) == 0 || string(in) == "null" {
		return ""
	}
	var v any
	s := string(in)
	if json.Unmarshal(in, &v) == nil {
		if b, err := json.Marshal(v); err == nil {
			s = string(b)
		}
	}
	s = strings.Join(strings.Fields(s), " ")
	const max = 160
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return " " + s
}
