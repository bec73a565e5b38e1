package standin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// runSession speaks Claude Code's stream-json input protocol: each user
// line on stdin is one turn (an init line, the user line echoed with
// isReplay, one assistant line, a result), answered in order; lines that
// arrive during a turn wait for it. A control_request of subtype interrupt
// is answered with a control_response and ends the running turn with an
// error_during_execution result. "/standin sleep=D" in a user message makes
// its turn last D. --resume=<id> continues that session id. It exits at
// stdin EOF, once the queued turns are done.
func runSession(args []string, stdin io.Reader, stdout io.Writer) int {
	s := newSession(args, stdout)
	turns := make(chan userMsg, 1024)
	go s.read(stdin, turns)
	n := 0
	for m := range turns {
		n++
		s.turn(n, m)
	}
	return 0
}

// session is one stream-json session: its id, its transcript file, and
// the channels between the stdin reader and the turns.
type session struct {
	sid     string
	cwd     string
	file    string // the transcript, "" without CLAUDE_CONFIG_DIR
	history int    // user messages in the transcript

	mu sync.Mutex // serialises emit
	w  *bufio.Writer

	interrupts chan struct{}
	deaf       atomic.Bool // silent=deaf: control requests go unanswered
	amu        sync.Mutex
	answers    map[string]chan string // permission request id → its answer
}

type userMsg struct {
	text string
	uuid string
}

func newSession(args []string, stdout io.Writer) *session {
	s := &session{
		sid:        uuid(),
		w:          bufio.NewWriter(stdout),
		interrupts: make(chan struct{}, 16),
		answers:    map[string]chan string{},
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--resume="); ok && v != "" {
			s.sid = v
		}
	}
	s.cwd, _ = os.Getwd()
	// Like Claude Code, it keeps the session's transcript under
	// $CLAUDE_CONFIG_DIR/projects/<project>/<session id>.jsonl, and a resumed
	// session finds it in any project directory.
	if dir := os.Getenv("CLAUDE_CONFIG_DIR"); dir != "" {
		if found, _ := filepath.Glob(filepath.Join(dir, "projects", "*", s.sid+".jsonl")); len(found) > 0 {
			s.file = found[0]
			if b, err := os.ReadFile(s.file); err == nil {
				s.history = strings.Count(string(b), "\n")
			}
		} else {
			_ = os.MkdirAll(filepath.Join(dir, "projects", "standin"), 0o755)
			s.file = filepath.Join(dir, "projects", "standin", s.sid+".jsonl")
		}
	}
	return s
}

// record appends a user message to the session's transcript.
func (s *session) record(text string) {
	if s.file == "" {
		return
	}
	f, err := os.OpenFile(s.file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	b, _ := json.Marshal(map[string]any{"type": "user", "text": text, "session_id": s.sid})
	_, _ = f.Write(append(b, '\n'))
	_ = f.Close()
}

// emit writes one line to stdout.
func (s *session) emit(v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(v)
	_, _ = s.w.Write(b)
	_ = s.w.WriteByte('\n')
	_ = s.w.Flush()
}

// inLine is a line of stdin, of any type.
type inLine struct {
	Type      string `json:"type"`
	RequestID string `json:"request_id"`
	UUID      string `json:"uuid"`
	Request   struct {
		Subtype string `json:"subtype"`
	} `json:"request"`
	Response struct {
		RequestID string `json:"request_id"`
		Response  struct {
			Behavior string `json:"behavior"`
			Message  string `json:"message"`
		} `json:"response"`
	} `json:"response"`
	Message struct {
		Content json.RawMessage `json:"content"`
	} `json:"message"`
}

// read reads stdin until EOF: user lines become turns, control responses
// answer permission requests, control requests are acknowledged (an
// interrupt also interrupts the running turn). It closes turns at EOF.
func (s *session) read(stdin io.Reader, turns chan<- userMsg) {
	defer close(turns)
	sc := bufio.NewScanner(stdin)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var m inLine
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		switch m.Type {
		case "user":
			var text string
			if json.Unmarshal(m.Message.Content, &text) != nil {
				text = string(m.Message.Content)
			}
			turns <- userMsg{text: text, uuid: m.UUID}
		case "control_response":
			s.amu.Lock()
			ch := s.answers[m.Response.RequestID]
			delete(s.answers, m.Response.RequestID)
			s.amu.Unlock()
			if ch != nil {
				a := m.Response.Response.Behavior
				if a == "deny" {
					a += ": " + m.Response.Response.Message
				}
				ch <- a
			}
		case "control_request":
			if s.deaf.Load() {
				continue
			}
			s.emit(ordered{{"type", "control_response"}, {"response", ordered{
				{"subtype", "success"}, {"request_id", m.RequestID}, {"response", ordered{}}}}})
			if m.Request.Subtype == "interrupt" {
				select {
				case s.interrupts <- struct{}{}:
				default:
				}
			}
		}
	}
}

// turn answers the n-th user message.
func (s *session) turn(n int, m userMsg) {
	start := time.Now()
	// An interrupt sent before this turn started is not for it.
	for len(s.interrupts) > 0 {
		<-s.interrupts
	}
	s.emit(ordered{
		{"type", "system"}, {"subtype", "init"}, {"cwd", s.cwd}, {"session_id", s.sid},
		{"tools", []string{}}, {"mcp_servers", []string{}}, {"model", Model},
		{"permissionMode", "default"}, {"apiKeySource", "none"},
		{"claude_code_version", "fleet-standin"}, {"uuid", uuid()},
	})
	u := m.uuid
	if u == "" {
		u = uuid()
	}
	s.emit(ordered{{"type", "user"}, {"message", ordered{{"role", "user"}, {"content", m.text}}},
		{"session_id", s.sid}, {"parent_tool_use_id", nil}, {"uuid", u}, {"isReplay", true}})
	// Like Claude Code, the user message is in the transcript before
	// the turn is answered.
	s.record(m.text)
	s.history++
	d, _ := parseDirectives(m.text)
	s.crashIfAsked(d)
	asked, interrupted := s.ask(d.ask)
	switch d.silent {
	case "deaf":
		s.deaf.Store(true)
		select {} // stalled, deaf to interrupts: until killed
	case "":
	default:
		<-s.interrupts // stalled until interrupted
		interrupted = true
	}
	if d.sleep > 0 && !interrupted {
		select {
		case <-time.After(d.sleep):
		case <-s.interrupts:
			interrupted = true
		}
	}
	interrupted = s.scriptedLines(d, interrupted)
	subtype, isErr := "success", false
	if interrupted {
		subtype, isErr = "error_during_execution", true
	} else {
		s.emit(ordered{
			{"type", "assistant"},
			{"message", ordered{
				{"id", "msg_standin_" + uuid()}, {"type", "message"}, {"role", "assistant"}, {"model", Model},
				{"content", []any{ordered{{"type", "text"}, {"text", fmt.Sprintf("[stand-in agent] You said: %s (%d earlier messages in this session)%s", quote(m.text), s.history-1, permissions(asked))}}}},
				{"stop_reason", nil}, {"stop_sequence", nil},
			}},
			{"parent_tool_use_id", nil}, {"session_id", s.sid}, {"uuid", uuid()},
		})
	}
	s.emit(ordered{
		{"type", "result"}, {"subtype", subtype}, {"is_error", isErr},
		{"duration_ms", time.Since(start).Milliseconds()}, {"duration_api_ms", 0},
		{"num_turns", n}, {"result", "[stand-in agent] turn done"}, {"stop_reason", "end_turn"},
		{"session_id", s.sid}, {"total_cost_usd", 0},
		{"usage", ordered{{"input_tokens", 0}, {"output_tokens", 0}}}, {"uuid", uuid()},
	})
}

// crashIfAsked exits the process, as a crashing agent would, when the
// message asks for a crash (or a crash once, the first time).
func (s *session) crashIfAsked(d directives) {
	crash := d.crash
	if d.crashOnce != "" {
		if _, err := os.Stat(d.crashOnce); errors.Is(err, os.ErrNotExist) {
			_ = os.WriteFile(d.crashOnce, []byte("crashed\n"), 0o644)
			crash = true
		}
	}
	if crash {
		s.mu.Lock()
		_ = s.w.Flush()
		os.Exit(1)
	}
}

// ask sends a permission request per tool and waits for the answers in
// order; an interrupt ends the wait.
func (s *session) ask(tools []string) (asked []string, interrupted bool) {
	if len(tools) == 0 {
		return nil, false
	}
	chans := make([]chan string, len(tools))
	for i, tool := range tools {
		id := "standin-req-" + uuid()
		chans[i] = make(chan string, 1)
		s.amu.Lock()
		s.answers[id] = chans[i]
		s.amu.Unlock()
		s.emit(ordered{{"type", "control_request"}, {"request_id", id}, {"request", ordered{
			{"subtype", "can_use_tool"}, {"tool_name", tool},
			{"input", ordered{{"command", "stand-in use of " + tool}}}}}})
	}
	for i, ch := range chans {
		select {
		case a := <-ch:
			asked = append(asked, tools[i]+" "+a)
		case <-s.interrupts:
			return asked, true
		}
	}
	return asked, false
}

// permissions says what the turn's permission requests were answered.
func permissions(asked []string) string {
	if len(asked) == 0 {
		return ""
	}
	return "; permissions: " + strings.Join(asked, "; ")
}

// scriptedLines writes a turn's lines=N lines (delay=D apart), as a
// one-shot run does, so that a warm agent (a session answering one turn)
// runs the same directives; an interrupt ends them. It reports whether the
// turn was interrupted.
func (s *session) scriptedLines(d directives, interrupted bool) bool {
	for i := 0; i < d.lines && !interrupted; i++ {
		if d.delay > 0 {
			select {
			case <-time.After(d.delay):
			case <-s.interrupts:
				return true
			}
		}
		s.emit(ordered{
			{"type", "assistant"},
			{"message", ordered{
				{"id", "msg_standin_" + uuid()}, {"type", "message"}, {"role", "assistant"}, {"model", Model},
				{"content", []any{ordered{{"type", "text"}, {"text", fmt.Sprintf("line %d", i+1)}}}},
				{"stop_reason", nil}, {"stop_sequence", nil},
			}},
			{"parent_tool_use_id", nil}, {"session_id", s.sid}, {"uuid", uuid()},
		})
	}
	return interrupted
}
