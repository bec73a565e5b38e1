package standin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// termExit is the exit code of a stand-in a SIGTERM ended (termresult).
const termExit = 143

func run(d directives, prompt string, w *bufio.Writer, stderr io.Writer) int {
	o := &oneShot{d: d, w: w, start: time.Now(), session: uuid()}
	cwd, _ := os.Getwd()
	for _, l := range d.say {
		fmt.Fprintln(stderr, l)
	}
	if d.stderr > 0 {
		_, _ = stderr.Write([]byte(strings.Repeat("e", d.stderr)))
	}
	if d.termResult {
		o.term = make(chan os.Signal, 1)
		signal.Notify(o.term, syscall.SIGTERM)
	}
	o.emit(ordered{
		{"type", "system"}, {"subtype", "init"}, {"cwd", cwd}, {"session_id", o.session},
		{"tools", []string{}}, {"mcp_servers", []string{}}, {"model", Model},
		{"permissionMode", "default"}, {"apiKeySource", "none"},
		{"claude_code_version", "fleet-standin"}, {"output_style", "default"}, {"uuid", uuid()},
	})
	text := "[stand-in agent] This is the bundled stand-in, not Claude. You asked: " + quote(prompt)
	if d.rateLimitReset > 0 {
		o.emit(ordered{
			{"type", "rate_limit_event"},
			{"rate_limit_info", ordered{{"status", "rejected"}, {"resetsAt", d.rateLimitReset}, {"rateLimitType", "five_hour"}}},
			{"uuid", uuid()}, {"session_id", o.session},
		})
	}
	o.emitText(0, text)
	o.flush()
	if d.silent != "" {
		select {} // stalled: until killed
	}
	if d.tool != "" {
		if err := o.toolCall(); err != nil {
			fmt.Fprintln(stderr, "stand-in agent: tool:", err)
			return 2
		}
	}
	for i, f := range d.files {
		o.emitText(10+i, doFileOp(f))
		o.flush()
	}
	if d.escape != "" {
		if err := escape(d.prefix, d.escape); err != nil {
			fmt.Fprintln(stderr, "stand-in agent: escape:", err)
			return 2
		}
	}
	if d.env != "" {
		o.emitText(1, d.env+"="+os.Getenv(d.env))
		o.flush()
	}
	if d.big > 0 {
		o.emitText(2, strings.Repeat("b", d.big))
		o.flush()
	}
	if o.writeLines() || d.sleep > 0 && o.pause(d.sleep) {
		o.result(false)
		o.flush()
		return termExit
	}
	if d.noResult {
		o.flush()
		return d.exit
	}
	o.results(text)
	o.flush()
	if d.hang {
		select {}
	}
	if d.exitSet {
		return d.exit
	}
	if d.isError {
		return 1
	}
	return 0
}

// oneShot is one run of the stand-in in -p mode: what it writes, and
// where.
type oneShot struct {
	d       directives
	w       *bufio.Writer
	start   time.Time
	session string
	term    chan os.Signal // SIGTERM, with termresult; nil otherwise
}

func (o *oneShot) emit(v any) {
	b, _ := json.Marshal(v)
	_, _ = o.w.Write(b)
	_ = o.w.WriteByte('\n')
}

func (o *oneShot) flush() { _ = o.w.Flush() }

// result is the result line of a run a SIGTERM ended.
func (o *oneShot) result(isError bool) {
	o.emit(ordered{
		{"type", "result"}, {"subtype", "success"}, {"is_error", isError},
		{"duration_ms", time.Since(o.start).Milliseconds()}, {"duration_api_ms", 0}, {"num_turns", 1},
		{"result", "[stand-in agent] done"}, {"stop_reason", "end_turn"}, {"session_id", o.session}, {"total_cost_usd", 0},
		{"usage", ordered{{"input_tokens", 0}, {"output_tokens", 0}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0}}},
		{"modelUsage", ordered{}}, {"permission_denials", []any{}}, {"uuid", uuid()},
	})
}

// results writes the d.results result lines of a run that went to its
// end.
func (o *oneShot) results(text string) {
	for range o.d.results {
		o.emit(ordered{
			{"type", "result"}, {"subtype", "success"}, {"is_error", o.d.isError},
			{"duration_ms", time.Since(o.start).Milliseconds()}, {"duration_api_ms", 0}, {"num_turns", 1},
			{"result", text}, {"stop_reason", "end_turn"}, {"session_id", o.session}, {"total_cost_usd", o.d.cost},
			{"usage", ordered{{"input_tokens", 0}, {"output_tokens", 0}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 0}}},
			{"modelUsage", ordered{}}, {"permission_denials", []any{}}, {"uuid", uuid()},
		})
	}
}

// pause sleeps for dur; with termresult, a SIGTERM ends it early and it
// reports true.
func (o *oneShot) pause(dur time.Duration) bool {
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-o.term:
		return true
	}
}

func (o *oneShot) emitText(n int, t string) {
	o.emit(ordered{
		{"type", "assistant"},
		{"message", ordered{
			{"id", fmt.Sprintf("msg_standin_%d", n)}, {"type", "message"}, {"role", "assistant"},
			{"model", Model}, {"content", []any{ordered{{"type", "text"}, {"text", t}}}},
			{"stop_reason", nil}, {"stop_sequence", nil},
			{"usage", ordered{{"input_tokens", 0}, {"output_tokens", 0}}},
		}},
		{"parent_tool_use_id", nil}, {"session_id", o.session}, {"uuid", uuid()},
	})
}

// writeLines writes the d.lines scripted lines and flushes; it reports
// true when a SIGTERM ended a delay between them.
//
// Scripted lines are built by hand (no reflection, no syscall per uuid) so
// the stand-in can write far faster than any relay reads: benchmarks then
// measure the fleet, not the agent.
func (o *oneShot) writeLines() (terminated bool) {
	d := &o.d
	rng := fastRand()
	var line []byte
	for i := range d.lines {
		if d.delay > 0 {
			o.flush()
			if o.pause(d.delay) {
				return true
			}
		}
		line = line[:0]
		line = append(line, `{"type":"assistant","message":{"id":"msg_standin_`...)
		line = strconv.AppendInt(line, int64(3+i), 10)
		line = append(line, `","type":"message","role":"assistant","model":"`+Model+`","content":[{"type":"text","text":"line `...)
		line = strconv.AppendInt(line, int64(i+1), 10)
		if d.stamp {
			line = append(line, " t="...)
			line = strconv.AppendInt(line, time.Now().UnixNano(), 10)
		}
		const rest = `"}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}},"parent_tool_use_id":null,"session_id":"` +
			`00000000-0000-4000-8000-000000000000","uuid":"00000000-0000-4000-8000-000000000000"}`
		if pad := d.size - len(line) - len(rest) - 1; pad > 0 {
			line = append(line, ' ')
			line = append(line, padding(pad-1)...)
		}
		line = append(line, `"}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}},"parent_tool_use_id":null,"session_id":"`...)
		line = append(line, o.session...)
		line = append(line, `","uuid":"`...)
		line = appendUUID(line, rng)
		line = append(line, "\"}\n"...)
		_, _ = o.w.Write(line)
	}
	o.flush()
	return false
}
