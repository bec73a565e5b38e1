// Package standin is the bundled STAND-IN agent: a small program that speaks
// Claude Code's stream-json output (`claude -p --output-format stream-json
// --verbose`) without calling any model. It lets the whole fleet run offline:
// `make run` uses it when `claude` is not installed, and the tests and
// benchmarks use it as a well-behaved agent.
//
// It is named as a stand-in wherever it shows: its init line reports model
// "fleet-standin" and version "fleet-standin", and its answer starts with
// "[stand-in agent]".
//
// It reads the prompt from stdin to EOF (as the worker sends it), accepts and
// ignores the claude flags the worker passes, and then either
//   - echoes: writes an init line, one assistant text line quoting the
//     prompt, and a success result; or
//   - replays a recorded real session unchanged (--standin-replay=NAME, NAME
//     one of plain-text, read-tool, tool-use-mcp).
//
// With --input-format stream-json it is a session instead (session.go): it
// reads user lines from stdin and answers each as one turn, until EOF.
// Session turns also read:
//
//	ask=T1,T2    ask permission to use tools T1 and T2 (control_request
//	             can_use_tool, as Claude Code does with
//	             --permission-prompt-tool stdio), all at once, and wait for
//	             every answer; the assistant line says what was allowed
//	crashonce=P  unless file P (relative to the working directory) exists,
//	             create it and exit 1 in the middle of the turn (after its
//	             user line was echoed and recorded, before any answer)
//	crash=1      exit 1 in the middle of the turn, every time
//
// A prompt that starts with "/standin" is read as test directives instead
// (space-separated key=value), so tests and benchmarks can script it:
//
//	lines=N      N extra assistant lines before the result
//	size=B       pad each extra line to about B bytes
//	big=B        one assistant line of B bytes
//	delay=D      sleep D (Go duration) between lines
//	sleep=D      sleep D before the result
//	stderr=B     write B bytes to stderr first
//	say=TEXT     write the line TEXT ('_' for ' ') to stderr first (repeatable)
//	noresult=1   exit without a result
//	exit=N       exit code (default 0; with a result, 1 when is_error)
//	error=1      the result has is_error:true
//	results=N    write N result lines
//	hang=1       after the result, never exit (until killed)
//	env=NAME     write one assistant line with the value of $NAME ("" if unset)
//	stamp=1      each extra line carries its write time as "t=<unix ns>"
//	escape=PATH  leave a process behind as Claude Code's Bash tool can: a
//	             double-forked grandchild in a session of its own (setsid)
//	             that ignores SIGTERM and sleeps an hour; its pid goes to PATH
//	termresult=1 on SIGTERM (during delay or sleep), write a success result
//	             and exit 143, as Claude Code does when stopped mid-tool
//
// File directives act on the working directory (a workspace checkout), in
// the order given, before the first extra line; each reports what it did in
// one assistant line:
//
//	append=PATH  append the line "stand-in edit" to PATH (created with its directories)
//	rm=PATH      delete PATH
//	binary=PATH  write a small binary file (NUL bytes) at PATH
//	many=N       write N files many/NNNN.txt
//	commit=MSG   git add -A and commit as "stand-in <standin@agentfleet.invalid>" (MSG: '_' for ' ')
//	cat=PATH     one assistant line with PATH's content
//	dumpenv=1    one assistant line with the whole environment
//	cost=X       the result's total_cost_usd (default 0)
//	ratelimit=T  first a rate_limit_event with status "rejected" and
//	             resetsAt T (Unix seconds)
//	silent=1     after the first assistant line, write nothing more and
//	             never exit (until killed): a stalled agent. In a session
//	             turn an interrupt still ends the turn; silent=deaf ignores
//	             it too
//	tool=busy    one tool call (an assistant tool_use line, then a user
//	tool=sleep   tool_result line) whose child process spins the CPU (busy)
//	             or sleeps, writing nothing, for toolfor=D (default 1h)
package standin

import (
	"bufio"
	"crypto/rand"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

//go:embed sessions/*.ndjson
var sessions embed.FS

// Model is the model name the stand-in reports.
const Model = "fleet-standin"

// Main runs the stand-in with args (without the program name) and returns
// the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	replay := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--standin-replay="); ok {
			replay = v
		}
		if v, ok := strings.CutPrefix(a, escapeMidFlag); ok {
			return escapeMid(selfArgs(args), v, stderr)
		}
		if a == escapeeFlag {
			signal.Ignore(syscall.SIGTERM)
			time.Sleep(time.Hour)
			return 0
		}
		if v, ok := strings.CutPrefix(a, toolChildFlag); ok {
			return toolChild(v)
		}
	}
	if slices.Contains(args, "stream-json") && slices.Contains(args, "--input-format") {
		return runSession(args, stdin, stdout)
	}
	prompt, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "stand-in agent: reading the prompt:", err)
		return 2
	}
	w := bufio.NewWriterSize(stdout, 64<<10)
	defer w.Flush()
	if replay != "" {
		b, err := sessions.ReadFile("sessions/" + replay + ".ndjson")
		if err != nil {
			fmt.Fprintf(stderr, "stand-in agent: no recorded session %q\n", replay)
			return 2
		}
		_, _ = w.Write(b)
		return 0
	}
	d, err := parseDirectives(string(prompt))
	if err != nil {
		fmt.Fprintln(stderr, "stand-in agent:", err)
		return 2
	}
	d.prefix = selfArgs(args)
	return run(d, string(prompt), w, stderr)
}

type directives struct {
	lines, size, big, stderr, exit, results int
	delay, sleep                            time.Duration
	noResult, isError, hang, stamp          bool
	env, escape                             string
	termResult                              bool
	exitSet                                 bool
	files                                   []fileOp
	ask                                     []string // session mode: permission requests
	crashOnce                               string   // session mode: marker file
	crash                                   bool     // session mode: crash every time
	prefix                                  []string // see selfArgs
	say                                     []string
	cost                                    float64
	rateLimitReset                          int64
	silent                                  string        // "1": go silent mid-turn; "deaf": and ignore interrupts
	tool                                    string        // "busy" or "sleep": a tool call with a child process
	toolFor                                 time.Duration // how long the tool's child runs
}

// fileOp is one file directive.
type fileOp struct{ op, arg string }

func parseDirectives(prompt string) (directives, error) {
	d := directives{results: 1}
	rest, ok := strings.CutPrefix(prompt, "/standin")
	if !ok {
		return d, nil
	}
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "lines":
			d.lines, err = strconv.Atoi(v)
		case "size":
			d.size, err = strconv.Atoi(v)
		case "big":
			d.big, err = strconv.Atoi(v)
		case "stderr":
			d.stderr, err = strconv.Atoi(v)
		case "say":
			d.say = append(d.say, strings.ReplaceAll(v, "_", " "))
		case "exit":
			d.exit, err = strconv.Atoi(v)
			d.exitSet = true
		case "results":
			d.results, err = strconv.Atoi(v)
		case "delay":
			d.delay, err = time.ParseDuration(v)
		case "sleep":
			d.sleep, err = time.ParseDuration(v)
		case "noresult":
			d.noResult = v == "1"
		case "error":
			d.isError = v == "1"
		case "hang":
			d.hang = v == "1"
		case "stamp":
			d.stamp = v == "1"
		case "termresult":
			d.termResult = v == "1"
		case "env":
			d.env = v
		case "append", "rm", "binary", "many", "commit", "cat", "dumpenv":
			d.files = append(d.files, fileOp{op: k, arg: v})
		case "escape":
			d.escape = v
		case "ask":
			d.ask = append(d.ask, strings.Split(v, ",")...)
		case "crashonce":
			d.crashOnce = v
		case "crash":
			d.crash = v == "1"
		case "cost":
			d.cost, err = strconv.ParseFloat(v, 64)
		case "ratelimit":
			d.rateLimitReset, err = strconv.ParseInt(v, 10, 64)
		case "silent":
			d.silent = v
		case "tool":
			d.tool = v
		case "toolfor":
			d.toolFor, err = time.ParseDuration(v)
		default:
			// Unknown words are part of the prompt text; ignore them.
		}
		if err != nil {
			return d, fmt.Errorf("directive %s: %w", f, err)
		}
	}
	return d, nil
}

var pad = strings.Repeat("x", 1<<20)

func padding(n int) string { return pad[:min(n, len(pad))] }

// fastRand is a seeded non-cryptographic generator for the scripted lines'
// uuids (unique enough for a stand-in, and no syscall per line).
func fastRand() *mrand.ChaCha8 {
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	return mrand.NewChaCha8(seed)
}

func appendUUID(b []byte, r *mrand.ChaCha8) []byte {
	var u [16]byte
	_, _ = r.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0xf])
	}
	return b
}

func quote(s string) string {
	const max = 2000
	if len(s) > max {
		s = s[:max] + "…"
	}
	return strings.TrimSpace(s)
}

// ordered is a JSON object that keeps its key order, like the real CLI's output.
type ordered []kv

type kv struct {
	k string
	v any
}

// MarshalJSON writes the keys in order.
func (o ordered) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(e.k)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(e.v)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// BinaryContent is what binary=PATH writes.
var BinaryContent = []byte{0, 0, 0x89, 'P', 'N', 'G', 0, 1, 2, 3, 0, 0xff, 0xfe, 0}

// doFileOp runs one file directive and says what happened.
func doFileOp(f fileOp) string {
	err := func() error {
		switch f.op {
		case "append":
			if err := os.MkdirAll(filepath.Dir(f.arg), 0o755); err != nil {
				return err
			}
			fh, err := os.OpenFile(f.arg, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			if _, err := fh.WriteString("stand-in edit\n"); err != nil {
				fh.Close()
				return err
			}
			return fh.Close()
		case "rm":
			return os.Remove(f.arg)
		case "binary":
			if err := os.MkdirAll(filepath.Dir(f.arg), 0o755); err != nil {
				return err
			}
			return os.WriteFile(f.arg, BinaryContent, 0o644)
		case "many":
			n, err := strconv.Atoi(f.arg)
			if err != nil {
				return err
			}
			if err := os.MkdirAll("many", 0o755); err != nil {
				return err
			}
			for i := range n {
				if err := os.WriteFile(fmt.Sprintf("many/%04d.txt", i), []byte(fmt.Sprintf("file %d\nstand-in\n", i)), 0o644); err != nil {
					return err
				}
			}
			return nil
		case "commit":
			for _, argv := range [][]string{
				{"git", "add", "-A"},
				{"git", "-c", "user.name=stand-in", "-c", "user.email=standin@agentfleet.invalid", "commit", "-q", "-m", strings.ReplaceAll(f.arg, "_", " ")},
			} {
				if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
					return fmt.Errorf("%v: %w: %s", argv, err, out)
				}
			}
			return nil
		case "cat":
			b, err := os.ReadFile(f.arg)
			if err != nil {
				return err
			}
			f.arg += ":\n" + string(b)
			return nil
		case "dumpenv":
			f.arg = strings.Join(os.Environ(), "\n")
			return nil
		}
		return nil
	}()
	if err != nil {
		return "[stand-in agent] " + f.op + " " + f.arg + ": " + err.Error()
	}
	return "[stand-in agent] " + f.op + " " + f.arg
}

// Flags of the re-executed stand-in for the escape directive.
const (
	escapeMidFlag = "--standin-escape-mid="
	escapeeFlag   = "--standin-escapee"
)

// escape does what Claude Code's Bash tool does with a background command,
// and worse: it starts a copy of this program that starts the escapee in a
// session of its own (setsid) and exits at once (a double fork), so the
// escapee, which ignores SIGTERM and sleeps an hour holding stdout and
// stderr, has PPID 1 and is out of the agent's process group. Its pid is
// written to pidFile.
func escape(prefix []string, pidFile string) error {
	cmd := exec.Command(self(), append(prefix, escapeMidFlag+pidFile)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func escapeMid(prefix []string, pidFile string, stderr io.Writer) int {
	cmd := exec.Command(self(), append(prefix, escapeeFlag)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "stand-in agent: escape:", err)
		return 2
	}
	tmp := pidFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		fmt.Fprintln(stderr, "stand-in agent: escape:", err)
		return 2
	}
	if err := os.Rename(tmp, pidFile); err != nil {
		fmt.Fprintln(stderr, "stand-in agent: escape:", err)
		return 2
	}
	return 0
}

func self() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}

// selfArgs returns the arguments before args in os.Args: what makes this
// binary the stand-in again (a test binary's mode flag; none for
// fleet-standin-agent). Main's callers pass a suffix of os.Args as args.
func selfArgs(args []string) []string {
	n := len(os.Args) - 1 - len(args)
	if n <= 0 {
		return nil
	}
	return slices.Clone(os.Args[1 : 1+n])
}
