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
	sid := uuid()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--resume="); ok && v != "" {
			sid = v
		}
	}
	cwd, _ := os.Getwd()
	// Like Claude Code, it keeps the session's transcript under
	// $CLAUDE_CONFIG_DIR/projects/<project>/<session id>.jsonl, and a resumed
	// session finds it in any project directory.
	history := 0
	file := ""
	if dir := os.Getenv("CLAUDE_CONFIG_DIR"); dir != "" {
		if found, _ := filepath.Glob(filepath.Join(dir, "projects", "*", sid+".jsonl")); len(found) > 0 {
			file = found[0]
			if b, err := os.ReadFile(file); err == nil {
				history = strings.Count(string(b), "\n")
			}
		} else {
			_ = os.MkdirAll(filepath.Join(dir, "projects", "standin"), 0o755)
			file = filepath.Join(dir, "projects", "standin", sid+".jsonl")
		}
	}
	record := func(text string) {
		if file == "" {
			return
		}
		f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		b, _ := json.Marshal(map[string]any{"type": "user", "text": text, "session_id": sid})
		_, _ = f.Write(append(b, '\n'))
		_ = f.Close()
	}
	var mu sync.Mutex
	w := bufio.NewWriter(stdout)
	emit := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(v)
		_, _ = w.Write(b)
		_ = w.WriteByte('\n')
		_ = w.Flush()
	}
	type userMsg struct {
		text string
		uuid string
	}
	turns := make(chan userMsg, 1024)
	interrupts := make(chan struct{}, 16)
	var amu sync.Mutex
	answers := map[string]chan string{} // permission request id → its answer
	go func() {
		defer close(turns)
		sc := bufio.NewScanner(stdin)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var m struct {
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
				amu.Lock()
				ch := answers[m.Response.RequestID]
				delete(answers, m.Response.RequestID)
				amu.Unlock()
				if ch != nil {
					a := m.Response.Response.Behavior
					if a == "deny" {
						a += ": " + m.Response.Response.Message
					}
					ch <- a
				}
			case "control_request":
				emit(ordered{{"type", "control_response"}, {"response", ordered{
					{"subtype", "success"}, {"request_id", m.RequestID}, {"response", ordered{}}}}})
				if m.Request.Subtype == "interrupt" {
					select {
					case interrupts <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	n := 0
	for m := range turns {
		n++
		start := time.Now()
		// An interrupt sent before this turn started is not for it.
		for len(interrupts) > 0 {
			<-interrupts
		}
		emit(ordered{
			{"type", "system"}, {"subtype", "init"}, {"cwd", cwd}, {"session_id", sid},
			{"tools", []string{}}, {"mcp_servers", []string{}}, {"model", Model},
			{"permissionMode", "default"}, {"apiKeySource", "none"},
			{"claude_code_version", "fleet-standin"}, {"uuid", uuid()},
		})
		u := m.uuid
		if u == "" {
			u = uuid()
		}
		emit(ordered{{"type", "user"}, {"message", ordered{{"role", "user"}, {"content", m.text}}},
			{"session_id", sid}, {"parent_tool_use_id", nil}, {"uuid", u}, {"isReplay", true}})
		// Like Claude Code, the user message is in the transcript before
		// the turn is answered.
		record(m.text)
		history++
		d, _ := parseDirectives(m.text)
		crash := d.crash
		if d.crashOnce != "" {
			if _, err := os.Stat(d.crashOnce); errors.Is(err, os.ErrNotExist) {
				_ = os.WriteFile(d.crashOnce, []byte("crashed\n"), 0o644)
				crash = true
			}
		}
		if crash {
			mu.Lock()
			_ = w.Flush()
			os.Exit(1)
		}
		interrupted := false
		var asked []string
		if len(d.ask) > 0 {
			chans := make([]chan string, len(d.ask))
			for i, tool := range d.ask {
				id := "standin-req-" + uuid()
				chans[i] = make(chan string, 1)
				amu.Lock()
				answers[id] = chans[i]
				amu.Unlock()
				emit(ordered{{"type", "control_request"}, {"request_id", id}, {"request", ordered{
					{"subtype", "can_use_tool"}, {"tool_name", tool},
					{"input", ordered{{"command", "stand-in use of " + tool}}}}}})
			}
			for i, ch := range chans {
				select {
				case a := <-ch:
					asked = append(asked, d.ask[i]+" "+a)
				case <-interrupts:
					interrupted = true
				}
				if interrupted {
					break
				}
			}
		}
		if d.sleep > 0 && !interrupted {
			select {
			case <-time.After(d.sleep):
			case <-interrupts:
				interrupted = true
			}
		}
		subtype, isErr := "success", false
		if interrupted {
			subtype, isErr = "error_during_execution", true
		} else {
			emit(ordered{
				{"type", "assistant"},
				{"message", ordered{
					{"id", "msg_standin_" + uuid()}, {"type", "message"}, {"role", "assistant"}, {"model", Model},
					{"content", []any{ordered{{"type", "text"}, {"text", fmt.Sprintf("[stand-in agent] You said: %s (%d earlier messages in this session)%s", quote(m.text), history-1, permissions(asked))}}}},
					{"stop_reason", nil}, {"stop_sequence", nil},
				}},
				{"parent_tool_use_id", nil}, {"session_id", sid}, {"uuid", uuid()},
			})
		}
		emit(ordered{
			{"type", "result"}, {"subtype", subtype}, {"is_error", isErr},
			{"duration_ms", time.Since(start).Milliseconds()}, {"duration_api_ms", 0},
			{"num_turns", n}, {"result", "[stand-in agent] turn done"}, {"stop_reason", "end_turn"},
			{"session_id", sid}, {"total_cost_usd", 0},
			{"usage", ordered{{"input_tokens", 0}, {"output_tokens", 0}}}, {"uuid", uuid()},
		})
	}
	return 0
}

// permissions says what the turn's permission requests were answered.
func permissions(asked []string) string {
	if len(asked) == 0 {
		return ""
	}
	return "; permissions: " + strings.Join(asked, "; ")
}
