package agent_test

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/standin"
)

// childFlag makes the test binary act as an agent (nomad's testtask
// pattern): argv is [test binary, childFlag, mode, <the runner's flags>…].
const childFlag = "--agent-test-child"

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == childFlag {
		os.Exit(child(os.Args[2], os.Args[3:]))
	}
	// Every run's goroutines (stdout reader, exit wait, stop) must be
	// gone once it returned.
	goleak.VerifyTestMain(m)
}

func child(mode string, args []string) int {
	switch mode {
	case "standin":
		return standin.Main(args, os.Stdin, os.Stdout, os.Stderr)
	case "garbage":
		fmt.Println("not json at all")
		fmt.Println("\x1b[?1004l")
		fmt.Println(`{"type":"assistant","message":{"content":[]},"extra":1}`)
		fmt.Println(`{"broken json`)
		fmt.Println(`{"subtype":"success","type":"result","is_error":false,"num_turns":1,"duration_ms":1,"total_cost_usd":0,"session_id":"s"}`)
		return 0
	case "no-stdin-exit":
		return 3
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println(`{"type":"system","subtype":"init","session_id":"s1"}`)
		time.Sleep(time.Hour)
		return 0
	case "argv":
		// Prints its argv as one assistant text line, then a result.
		fmt.Printf(`{"type":"assistant","text":%q}`+"\n", strings.Join(args, "\x00"))
		fmt.Println(`{"type":"result","subtype":"success","is_error":false}`)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown child mode", mode)
	return 99
}
