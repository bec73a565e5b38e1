// Package agent runs one agent (Claude Code, or any program that speaks its
// stream-json output) in a sandbox and hands every line it writes to the
// caller, in order, as it arrives.
//
// # The command
//
// BuildArgv makes the argv from the configured command (--agent-cmd: the
// program and its fixed leading args) and the job's options:
//
//	<command…> -p --output-format stream-json --verbose [--model M] [--max-turns N]
//	  [--max-budget-usd X] [--permission-mode P] [--allowedTools a,b]
//	  [--disallowedTools c] [--system-prompt=S] [--append-system-prompt=S] [--resume=ID]
//
// The prompt is written to the process's stdin, which is then closed: no
// prompt text can become a flag or reach a shell (there is none; the argv is
// exec'd directly). Free-text values use the equals form so a value that
// starts with "-" cannot be read as a flag.
//
// # Ordering
//
// One goroutine reads stdout with protocol.LineReader (no fixed small
// buffer; lines over Config.MaxLine become a marker line) and calls the
// EmitFunc for each line in the order the agent wrote them, before reading
// the next. Lines are passed unchanged (Line.Raw), whatever they contain:
// JSON of any type, or not JSON at all. Stderr is drained by the sandbox all
// the time; its tail goes into a synthetic result.
//
// # How a run ends
//
//   - The agent wrote a result (one or more; the last one counts): after the
//     latest, the process gets Config.ResultGrace to exit, then its process
//     group is stopped (SIGTERM, Config.KillGrace, SIGKILL). Nothing is added.
//   - The run context is cancelled with cause ErrHandback (worker shutdown):
//     the process is stopped and nothing is added; Outcome.HandedBack is set
//     so the job goes back to the queue and continues as a next attempt.
//   - Otherwise (cancel with ErrCancelled, Request.Timeout, the agent crashed
//     or exited without a result, it could not be started, its output passed
//     Config.MaxOutputBytes) the runner emits exactly one synthetic result
//     (protocol.SyntheticResult) through the same EmitFunc, last.
//
// Run returns an error, and emits no synthetic result, only when the
// sandbox was unavailable (errors.Is(err, sandbox.ErrUnavailable): an
// infrastructure failure the caller retries as a new attempt) or when the
// EmitFunc failed (the process is then killed, and stdout is drained so the
// child never blocks on a full pipe meanwhile).
package agent
