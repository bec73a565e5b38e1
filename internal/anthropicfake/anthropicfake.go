// Package anthropicfake is an in-process fake of the Anthropic Messages API
// for tests that run the real Claude Code CLI offline (ANTHROPIC_BASE_URL
// pointed at it).
//
// It streams answers the way the real API does (SSE: message_start, then
// per content block content_block_start / content_block_delta /
// content_block_stop, then message_delta with the stop_reason and
// message_stop), with text and tool_use blocks. Each test scripts the
// answers with a ReplyFunc, which sees the request; every request is
// recorded. Non-streaming requests get the same reply as one JSON message,
// and count_tokens is answered, so the CLI runs without network.
//
// Requests that are not the conversation (the CLI's own side requests, e.g.
// a title or a quota probe) are told apart by IsConversation: they carry no
// tools.
package anthropicfake

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Block is one content block of a scripted reply.
type Block struct {
	// Text is a text block's text.
	Text string
	// ToolName and ToolInput make a tool_use block (ToolID is generated when
	// empty).
	ToolName  string
	ToolInput any
	ToolID    string
}

// Text returns a text block.
func Text(s string) Block { return Block{Text: s} }

// ToolUse returns a tool_use block.
func ToolUse(name string, input any) Block { return Block{ToolName: name, ToolInput: input} }

// Reply is one scripted answer.
type Reply struct {
	Blocks []Block
	// Hold, when set, is waited for (or the request's end) after the first
	// block has been streamed, so a test can act while a turn runs.
	Hold <-chan struct{}
	// Status, when not 0 or 200, answers with this HTTP error instead (an
	// Anthropic-shaped error body whose type fits the status).
	Status int
	// Header is added to the response (e.g. retry-after on a 429).
	Header map[string]string
	// Usage, when set, is the usage the reply reports: in message_start
	// (output_tokens 1) and, cumulative as the API does, in message_delta.
	Usage *Usage
	// Stall, when set, is waited for (or the request's end) before anything
	// is written: an upstream that hangs before its headers.
	Stall <-chan struct{}
	// Drop, when set, breaks the connection after the first block has been
	// streamed: an upstream that dies mid-stream.
	Drop bool
}

// Usage is the token usage a reply reports.
type Usage struct {
	InputTokens, OutputTokens, CacheReadInputTokens, CacheCreationInputTokens int
}

// ReplyFunc scripts the answer to one conversation request.
type ReplyFunc func(r *Request) Reply

// Request is one recorded request.
type Request struct {
	Path   string
	Body   map[string]any
	Stream bool
	Model  string
	// Messages are the request's messages (role, content as sent).
	Messages []Message
	// Tools are the names of the tools offered.
	Tools []string
	// Header is the request's header as the fake received it (the
	// credential the caller sent is in x-api-key or Authorization).
	Header http.Header
}

// Message is one message of a request.
type Message struct {
	Role    string
	Content json.RawMessage
}

// IsConversation reports whether the request is the agent's conversation
// (it offers tools) rather than one of the CLI's side requests.
func (r *Request) IsConversation() bool { return r.Path == "/v1/messages" && len(r.Tools) > 0 }

// UserTexts returns every text the user messages of the request carry, in
// order (tool results excluded).
func (r *Request) UserTexts() []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role != "user" {
			continue
		}
		out = append(out, textsOf(m.Content, false)...)
	}
	return out
}

// AssistantTexts returns every text the assistant messages carry, in order.
func (r *Request) AssistantTexts() []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "assistant" {
			out = append(out, textsOf(m.Content, false)...)
		}
	}
	return out
}

// LastUserText is the last text of the last user message ("" if none).
func (r *Request) LastUserText() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role != "user" {
			continue
		}
		t := textsOf(r.Messages[i].Content, false)
		if len(t) > 0 {
			return t[len(t)-1]
		}
		return ""
	}
	return ""
}

// ToolResults returns the contents of every tool_result block, in order.
func (r *Request) ToolResults() []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "user" {
			out = append(out, textsOf(m.Content, true)...)
		}
	}
	return out
}

// textsOf extracts text blocks (or, with results, tool_result contents).
func textsOf(content json.RawMessage, results bool) []string {
	var s string
	if json.Unmarshal(content, &s) == nil {
		if results {
			return nil
		}
		return []string{s}
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(content, &blocks) != nil {
		return nil
	}
	var out []string
	for _, b := range blocks {
		switch {
		case !results && b.Type == "text":
			// The CLI adds <system-reminder> blocks of its own; skip them.
			if strings.HasPrefix(strings.TrimSpace(b.Text), "<system-reminder>") {
				continue
			}
			out = append(out, b.Text)
		case results && b.Type == "tool_result":
			var str string
			if json.Unmarshal(b.Content, &str) == nil {
				out = append(out, str)
				continue
			}
			out = append(out, textsOf(b.Content, false)...)
		}
	}
	return out
}

// Server is the fake API.
type Server struct {
	// URL is the base URL for ANTHROPIC_BASE_URL.
	URL string

	srv   *httptest.Server
	reply ReplyFunc
	mu    sync.Mutex
	reqs  []*Request
	ids   atomic.Int64
	// OnRequest, if set, is called for every conversation request once it
	// is recorded (before it is answered).
	onRequest func(*Request)
}

// New starts a fake on loopback, closed when the test ends. reply scripts
// the conversation's answers; nil answers "ok".
func New(t testing.TB, reply ReplyFunc) *Server {
	t.Helper()
	s := &Server{reply: reply}
	if s.reply == nil {
		s.reply = func(*Request) Reply { return Reply{Blocks: []Block{Text("ok")}} }
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// OnRequest sets a hook called for every conversation request.
func (s *Server) OnRequest(f func(*Request)) {
	s.mu.Lock()
	s.onRequest = f
	s.mu.Unlock()
}

// Env is the environment the CLI needs to talk to the fake offline.
func (s *Server) Env() map[string]string {
	return map[string]string{
		"ANTHROPIC_BASE_URL":                       s.URL,
		"ANTHROPIC_API_KEY":                        "sk-ant-fake-key-for-tests",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
	}
}

// Requests returns every request so far.
func (s *Server) Requests() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Request(nil), s.reqs...)
}

// Conversation returns the conversation requests so far.
func (s *Server) Conversation() []*Request {
	var out []*Request
	for _, r := range s.Requests() {
		if r.IsConversation() {
			out = append(out, r)
		}
	}
	return out
}

func (s *Server) serve(w http.ResponseWriter, hr *http.Request) {
	body, _ := io.ReadAll(hr.Body)
	req := &Request{Path: hr.URL.Path, Header: hr.Header.Clone()}
	_ = json.Unmarshal(body, &req.Body)
	var parsed struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	_ = json.Unmarshal(body, &parsed)
	req.Model, req.Stream = parsed.Model, parsed.Stream
	for _, m := range parsed.Messages {
		req.Messages = append(req.Messages, Message{Role: m.Role, Content: m.Content})
	}
	for _, t := range parsed.Tools {
		req.Tools = append(req.Tools, t.Name)
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	hook := s.onRequest
	s.mu.Unlock()

	switch {
	case strings.HasSuffix(req.Path, "/count_tokens"):
		writeJSON(w, map[string]any{"input_tokens": 10})
		return
	case req.Path != "/v1/messages":
		// Anything else the CLI may ask (it should ask nothing with
		// nonessential traffic disabled): an empty success.
		writeJSON(w, map[string]any{})
		return
	}
	var rep Reply
	if req.IsConversation() {
		if hook != nil {
			hook(req)
		}
		rep = s.reply(req)
	} else {
		rep = Reply{Blocks: []Block{Text("side request")}}
	}
	if rep.Stall != nil {
		select {
		case <-rep.Stall:
		case <-hr.Context().Done():
			return
		}
	}
	for k, v := range rep.Header {
		w.Header().Set(k, v)
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.Status)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": errorType(rep.Status), "message": "scripted error"}})
		return
	}
	s.answer(w, hr, req, rep)
}

// errorType is the Anthropic error type of an HTTP status.
func errorType(status int) string {
	switch status {
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusBadRequest:
		return "invalid_request_error"
	}
	return "api_error"
}

func (s *Server) answer(w http.ResponseWriter, hr *http.Request, req *Request, rep Reply) {
	u := Usage{InputTokens: 10, OutputTokens: 5}
	if rep.Usage != nil {
		u = *rep.Usage
	}
	msgID := fmt.Sprintf("msg_fake_%d", s.ids.Add(1))
	model := cmp.Or(req.Model, "claude-fake")
	blocks, stop := s.contentOf(rep.Blocks)
	if !req.Stream {
		writeJSON(w, map[string]any{
			"id": msgID, "type": "message", "role": "assistant", "model": model,
			"content": blocks, "stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": u.InputTokens, "output_tokens": u.OutputTokens,
				"cache_read_input_tokens": u.CacheReadInputTokens, "cache_creation_input_tokens": u.CacheCreationInputTokens},
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	ev := func(name string, data any) {
		b, _ := json.Marshal(data)
		_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if fl != nil {
			fl.Flush()
		}
	}
	ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": msgID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": u.InputTokens, "output_tokens": 1,
			"cache_creation_input_tokens": u.CacheCreationInputTokens, "cache_read_input_tokens": u.CacheReadInputTokens},
	}})
	for i, b := range blocks {
		switch b["type"] {
		case "text":
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "text", "text": ""}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		case "tool_use":
			in, _ := json.Marshal(b["input"])
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		}
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
		if i == 0 && rep.Drop {
			panic(http.ErrAbortHandler)
		}
		if i == 0 && rep.Hold != nil {
			select {
			case <-rep.Hold:
			case <-hr.Context().Done():
				return
			}
		}
	}
	ev("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": u.OutputTokens, "input_tokens": u.InputTokens,
			"cache_creation_input_tokens": u.CacheCreationInputTokens, "cache_read_input_tokens": u.CacheReadInputTokens}})
	ev("message_stop", map[string]any{"type": "message_stop"})
}

func (s *Server) contentOf(bs []Block) ([]map[string]any, string) {
	stop := "end_turn"
	out := make([]map[string]any, 0, len(bs))
	for _, b := range bs {
		if b.ToolName == "" {
			out = append(out, map[string]any{"type": "text", "text": b.Text})
			continue
		}
		id := b.ToolID
		if id == "" {
			id = fmt.Sprintf("toolu_fake_%d", s.ids.Add(1))
		}
		in := b.ToolInput
		if in == nil {
			in = map[string]any{}
		}
		out = append(out, map[string]any{"type": "tool_use", "id": id, "name": b.ToolName, "input": in})
		stop = "tool_use"
	}
	return out, stop
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
