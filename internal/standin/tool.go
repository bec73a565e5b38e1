package standin

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// toolChildFlag re-executes the stand-in as a tool's child process:
// "busy:D" spins the CPU for D, "sleep:D" sleeps for D.
const toolChildFlag = "--standin-tool-child="

// toolCall is the tool directive: a tool_use line, a child process that
// runs for toolfor writing nothing, then the tool_result line.
func (o *oneShot) toolCall() error {
	d := o.d
	dur := d.toolFor
	if dur == 0 {
		dur = time.Hour
	}
	id := "toolu_standin_" + uuid()[:8]
	o.emit(ordered{
		{"type", "assistant"},
		{"message", ordered{
			{"id", "msg_standin_tool"}, {"type", "message"}, {"role", "assistant"}, {"model", Model},
			{"content", []any{ordered{{"type", "tool_use"}, {"id", id}, {"name", "Bash"},
				{"input", ordered{{"command", "stand-in " + d.tool + " for " + dur.String()}}}}}},
			{"stop_reason", "tool_use"}, {"stop_sequence", nil},
		}},
		{"parent_tool_use_id", nil}, {"session_id", o.session}, {"uuid", uuid()},
	})
	o.flush()
	cmd := exec.Command(self(), append(d.prefix, toolChildFlag+d.tool+":"+dur.String())...)
	err := cmd.Run()
	o.emit(ordered{
		{"type", "user"},
		{"message", ordered{{"role", "user"}, {"content", []any{ordered{
			{"tool_use_id", id}, {"type", "tool_result"}, {"content", "stand-in tool done"}, {"is_error", err != nil}}}}}},
		{"parent_tool_use_id", nil}, {"session_id", o.session}, {"uuid", uuid()},
	})
	o.flush()
	return nil
}

// toolChild is the tool's child process.
func toolChild(spec string) int {
	kind, ds, _ := strings.Cut(spec, ":")
	dur, err := time.ParseDuration(ds)
	if err != nil {
		fmt.Println("stand-in tool child:", err)
		return 2
	}
	end := time.Now().Add(dur)
	switch kind {
	case "busy":
		n := 0
		for time.Now().Before(end) {
			for i := range 1 << 16 {
				n += i
			}
		}
		if n == 42 {
			fmt.Print("")
		}
	default:
		time.Sleep(dur)
	}
	// At once: a race-enabled build (a test binary as the stand-in) would
	// otherwise sleep a second at exit, a sleeping tool child.
	syscall.Exit(0)
	return 0
}
