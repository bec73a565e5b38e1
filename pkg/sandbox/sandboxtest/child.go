package sandboxtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ChildFlag, as argv[1], switches a test binary whose TestMain calls
// RunChild into child mode. The marker travels in argv, not in the
// environment, because sandboxes build the child's environment from an
// allow-list and would drop it.
const ChildFlag = "--sandboxtest-child"

// childExitUsage is the exit code of a child whose script is wrong.
const childExitUsage = 125

// RunChild runs the child script and exits the process if os.Args[1] is
// ChildFlag; otherwise it returns false at once. Call it first in TestMain:
//
//	func TestMain(m *testing.M) {
//		if !sandboxtest.RunChild() {
//			os.Exit(m.Run())
//		}
//	}
//
// The script is the arguments after ChildFlag up to the first one that starts
// with "-"; each argument is one step, a command and its operands separated
// by spaces, run in order. Arguments from the first "-" on are not steps:
// they are what a caller appended (for example an agent runner's
// "-p --output-format stream-json -- <prompt>") and the "args" step prints
// them. After the last step the child exits 0. Steps:
//
//	echo <text>              write text and a newline to stdout
//	stderr <n>               write Pattern(n) to stderr
//	stdin-echo               copy stdin to stdout until EOF
//	sleep <duration>         sleep (time.ParseDuration syntax)
//	exit <code>              exit with code
//	ignore-sigterm           ignore SIGTERM from now on
//	fork-grandchild <file>   start a grandchild (this binary, sleeping an hour)
//	                         that shares stdout and stderr, and write its pid
//	                         to file (relative to the working directory)
//	fork-detached <file>     the same, but the grandchild calls setsid and so
//	                         leaves the process group
//	escape <file>            what Claude Code's Bash tool does, and worse: a
//	                         double fork (through a child that exits at once)
//	                         of a grandchild that calls setsid, ignores
//	                         SIGTERM, shares stdout and stderr and sleeps an
//	                         hour, its pid written to file; its parent is
//	                         then init (or a subreaper)
//	env                      print the environment as one JSON object line
//	pwd                      print the working directory
//	kill-self <SIGNAME>      send the signal (e.g. SIGKILL) to itself
//	lines <n> <size>         write Line(i, size) for i in [0, n), each + "\n"
//	print-file <path>        copy a file to stdout
//	write-file <path> <text> write text to a file, creating parent directories
//	args                     print the arguments after the script as a JSON array
//	try-read <path>          print "ok <content>" or "err <reason>" (never fails)
//	try-write <path>         write "escaped" to path: "ok" or "err <reason>"
//	try-signal <pid>         kill(pid, SIGTERM): "ok" or "err <reason>"
//	try-dial <host:port>     a TCP connection: "ok" or "err <reason>"
//	try-userns               run `unshare --user true`: "ok" or "err <reason>"
//	try-get <url>            an HTTP GET through the environment's proxy
//	                         settings: "ok <status> <body>" or "err <reason>"
//
// A malformed step makes the child print the problem to stderr and exit 125.
func RunChild() bool {
	if len(os.Args) < 2 || os.Args[1] != ChildFlag {
		return false
	}
	// syscall.Exit, not os.Exit: a race-enabled binary exiting through
	// os.Exit(0) sleeps a second for late race reports, on every child.
	// Stdout and stderr are unbuffered, so nothing is lost.
	syscall.Exit(runChild(os.Args[2:]))
	return true // unreachable
}

// ChildArgv returns argv that runs steps in child mode of the running test
// binary (os.Executable).
func ChildArgv(steps ...string) []string {
	return ChildArgvFor(executable(), steps...)
}

// ChildArgvFor returns argv that runs steps in child mode of binary.
func ChildArgvFor(binary string, steps ...string) []string {
	return append([]string{binary, ChildFlag}, steps...)
}

func executable() string {
	exe, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return exe
}

// Pattern returns n bytes of a fixed, position-dependent pattern (what the
// "stderr" step writes), so a test can compute the expected tail.
func Pattern(n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789\n"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[i%len(alphabet)]
	}
	return b
}

// Line returns line i of the "lines" step: size bytes (no newline) starting
// with i in decimal, zero-padded to 8 digits, then filler.
func Line(i, size int) string {
	s := fmt.Sprintf("%08d", i)
	if size <= len(s) {
		return s[:max(size, 0)]
	}
	return s + strings.Repeat("x", size-len(s))
}

// runChild runs the script in args and returns the exit code.
func runChild(args []string) int {
	steps, extra := args, []string(nil)
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			steps, extra = args[:i], args[i:]
			break
		}
	}
	for _, step := range steps {
		code, exit, err := runStep(step, extra)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandboxtest child: step %q: %v\n", step, err)
			return childExitUsage
		}
		if exit {
			return code
		}
	}
	return 0
}

// runStep runs one step. exit reports that the child must exit with code.
func runStep(step string, extra []string) (code int, exit bool, err error) {
	cmd, rest, _ := strings.Cut(step, " ")
	switch cmd {
	case "echo":
		_, err = fmt.Fprintln(os.Stdout, rest)
	case "try-read", "try-write", "try-signal", "try-dial", "try-get", "try-userns":
		_, err = fmt.Fprintln(os.Stdout, try(cmd, rest))
	case "stderr":
		var n int
		if n, err = strconv.Atoi(rest); err == nil {
			_, err = os.Stderr.Write(Pattern(n))
		}
	case "stdin-echo":
		_, err = io.Copy(os.Stdout, os.Stdin)
	case "stdin-lines":
		// Answers each stdin line as it arrives ("got <line>"), until EOF.
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if _, err = fmt.Fprintln(os.Stdout, "got "+sc.Text()); err != nil {
				break
			}
		}
	case "sleep":
		var d time.Duration
		if d, err = time.ParseDuration(rest); err == nil {
			time.Sleep(d)
		}
	case "exit":
		if code, err = strconv.Atoi(rest); err == nil {
			return code, true, nil
		}
	case "ignore-sigterm":
		signal.Ignore(syscall.SIGTERM)
	case "fork-grandchild", "fork-detached":
		err = forkGrandchild(rest, cmd == "fork-detached", "sleep 1h")
	case "fork-stubborn": // the middle of "escape"
		err = forkGrandchild(rest, true, "ignore-sigterm", "sleep 1h")
	case "escape":
		mid := exec.Command(executable(), ChildFlag, "fork-stubborn "+rest)
		mid.Stdout, mid.Stderr = os.Stdout, os.Stderr
		err = mid.Run()
	case "env":
		env := make(map[string]string)
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		err = printJSON(env)
	case "pwd":
		var wd string
		if wd, err = os.Getwd(); err == nil {
			_, err = fmt.Fprintln(os.Stdout, wd)
		}
	case "kill-self":
		sig := unix.SignalNum(rest)
		if sig == 0 {
			return 0, false, fmt.Errorf("unknown signal %q", rest)
		}
		if err = syscall.Kill(os.Getpid(), sig); err == nil {
			time.Sleep(time.Minute) // the signal is on its way; exiting first would hide it
			return 0, false, fmt.Errorf("still alive after %s", rest)
		}
	case "lines":
		err = writeLines(rest)
	case "print-file":
		var f *os.File
		if f, err = os.Open(rest); err == nil {
			_, err = io.Copy(os.Stdout, f)
			_ = f.Close()
		}
	case "write-file":
		path, text, _ := strings.Cut(rest, " ")
		if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			err = os.WriteFile(path, []byte(text), 0o644)
		}
	case "args":
		if extra == nil {
			extra = []string{}
		}
		err = printJSON(extra)
	default:
		err = fmt.Errorf("unknown step")
	}
	return 0, false, err
}

func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(b, '\n'))
	return err
}

func writeLines(operands string) error {
	f := strings.Fields(operands)
	if len(f) != 2 {
		return fmt.Errorf("want <n> <size>")
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return err
	}
	size, err := strconv.Atoi(f[1])
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(os.Stdout, 64<<10)
	for i := range n {
		if _, err := w.WriteString(Line(i, size) + "\n"); err != nil {
			return err
		}
	}
	return w.Flush()
}

// forkGrandchild starts this binary running steps with the same stdout and
// stderr, writes its pid to pidFile (atomically) and returns without waiting
// for it.
func forkGrandchild(pidFile string, detached bool, steps ...string) error {
	if pidFile == "" {
		return fmt.Errorf("want a pid file")
	}
	cmd := exec.Command(executable(), append([]string{ChildFlag}, steps...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tmp := pidFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, pidFile); err != nil {
		return err
	}
	return cmd.Process.Release()
}
