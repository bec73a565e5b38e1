package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Causes a caller puts on the run context with context.WithCancelCause (or
// that the runner itself uses) so the run knows why it is being stopped.
var (
	// ErrCancelled: a user cancelled the query. The run ends with a synthetic
	// result (reason "cancelled") unless the agent already wrote a result.
	ErrCancelled = errors.New("agent: run cancelled")
	// ErrTimeout: options.timeout_s elapsed (set by the runner itself).
	ErrTimeout = errors.New("agent: run timed out")
	// ErrHandback: the worker is shutting down and hands the job back to the
	// queue. The process is stopped and NO synthetic result is written, because
	// the query continues as a next attempt elsewhere.
	ErrHandback = errors.New("agent: run handed back")
	// ErrStalled: the agent wrote no line for its stall timeout while a
	// turn ran (the worker's stall watchdog). The run ends with a synthetic
	// result, reason "stalled". Use StallError to say how long it was silent.
	ErrStalled = errors.New("agent: run stalled")
)

// StallError is the cause of a run stopped as stalled: the agent's silence.
// errors.Is(err, ErrStalled) is true.
type StallError struct {
	// Silence is how long the agent had written nothing.
	Silence time.Duration
}

func (e StallError) Error() string {
	return fmt.Sprintf("worker: the agent wrote nothing for %.1f seconds while its turn ran (stalled)", e.Silence.Seconds())
}

// Is makes errors.Is(err, ErrStalled) true.
func (e StallError) Is(target error) bool { return target == ErrStalled }

// Config configures a Runner.
type Config struct {
	// Command is the agent program and its fixed leading args (from
	// --agent-cmd). Required.
	Command []string
	// ResultGrace is how long the process may take to exit after it wrote a
	// result line before its process group is stopped. Defaults to 10s.
	ResultGrace time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL when stopping.
	// Defaults to 5s.
	KillGrace time.Duration
	// MaxLine caps one stdout line; a longer line is replaced by a marker.
	// Defaults to protocol.DefaultMaxLine (64 MiB).
	MaxLine int
	// MaxOutputBytes caps the run's total stdout; past it the run is stopped
	// and ends with reason output_too_large. Defaults to 4 GiB.
	MaxOutputBytes int64
	// StderrTailBytes is how much stderr is kept for the synthetic result.
	// Defaults to 8 KiB.
	StderrTailBytes int
	// Logger receives run events (never prompts or output). Defaults to Nop.
	Logger *zerolog.Logger
}

func (c Config) withDefaults() Config {
	c.ResultGrace = cmp.Or(c.ResultGrace, 10*time.Second)
	c.KillGrace = cmp.Or(c.KillGrace, 5*time.Second)
	c.MaxLine = cmp.Or(c.MaxLine, protocol.DefaultMaxLine)
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, 4<<30)
	c.StderrTailBytes = cmp.Or(c.StderrTailBytes, 8<<10)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c Config) validate() error {
	switch {
	case len(c.Command) == 0 || c.Command[0] == "":
		return errors.New("agent: Command must name the agent program")
	case c.ResultGrace < 0:
		return errors.New("agent: ResultGrace must not be negative")
	case c.KillGrace < 0:
		return errors.New("agent: KillGrace must not be negative")
	case c.MaxLine < 1024:
		return errors.New("agent: MaxLine must be at least 1024 bytes")
	case c.MaxOutputBytes < 0:
		return errors.New("agent: MaxOutputBytes must not be negative")
	}
	return nil
}

// Runner runs agent processes in sandboxes. It is safe for concurrent use.
type Runner struct {
	cfg Config
}

// New returns a Runner; cfg gets its defaults, then is validated.
func New(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg}, nil
}

// Request is one run.
type Request struct {
	// Sandbox to run in. Required.
	Sandbox sandbox.Sandbox
	// Job supplies the prompt (stdin) and options (flags). Required.
	Job *protocol.Job
	// Env is extra environment for the agent, already filtered by the
	// operator's allow-list.
	Env map[string]string
	// ProcID names the process in the sandbox. Defaults to "agent".
	ProcID string
	// Timeout bounds the run's wall clock (options.timeout_s); 0 = none.
	Timeout time.Duration
}

// Line is one line of agent output handed to the EmitFunc.
type Line struct {
	// Raw is the line's bytes, unchanged, without its terminator. It is only
	// valid during the EmitFunc call.
	Raw []byte
	// Msg is the parsed header; Msg.Raw aliases Raw.
	Msg protocol.Message
	// Synthetic is true for the result the runner wrote itself.
	Synthetic bool
}

// EmitFunc receives every line in order, from a single goroutine. An error
// stops the run (the process group is killed) and is returned by Run.
type EmitFunc func(Line) error

// Outcome is how a run ended.
type Outcome struct {
	// Result is the last result line's view: the agent's own or the synthetic
	// one. Nil only when the run was handed back.
	Result *protocol.Result
	// Synthetic is true when the runner wrote the result.
	Synthetic bool
	// Reason is the synthetic result's reason ("" when the agent wrote one).
	Reason string
	// Exit is the process's exit status (nil when it never started).
	Exit *sandbox.ExitStatus
	// Lines counts the lines emitted, synthetic included.
	Lines uint64
	// Oversized counts lines replaced by a marker because they broke MaxLine.
	Oversized int
	// SessionID is the agent's session id, when it wrote one.
	SessionID string
	// HandedBack is true when the run was stopped with ErrHandback before any
	// result: the job should go back to the queue.
	HandedBack bool
}

// Succeeded reports whether the final result says success (!is_error).
func (o Outcome) Succeeded() bool { return o.Result != nil && !o.Result.IsError }

type readerResult struct {
	err        error // stdout read failure (not io.EOF)
	emitErr    error
	lines      uint64
	oversized  int
	tooLarge   bool
	lastResult *protocol.Result
	sessionID  string
	// lateResults counts result lines read after the run was stopped:
	// relayed unchanged, but not the run's outcome.
	lateResults int
}

// Run starts the agent for req.Job in req.Sandbox and calls emit for every
// line it writes, in order, as lines arrive. It returns when the process has
// exited and its stdout is drained.
//
// The run ends in exactly one of these ways:
//   - the agent wrote at least one result before the run was stopped: after
//     the last one the process gets ResultGrace to exit, then its group is
//     stopped; no synthetic result.
//   - ctx is cancelled with cause ErrHandback before a result: the process is
//     stopped, Outcome.HandedBack is set, nothing more is emitted.
//   - otherwise (cancel, timeout, crash, spawn failure, output too large) the
//     runner emits one synthetic result, exactly once.
//
// Once the runner has decided to stop the process (cancel, timeout,
// hand-back, output too large, emit failure), that decision is the outcome:
// a result the agent writes after it (Claude Code writes result/success
// when SIGTERM stops its tool) is still emitted unchanged, but it does not
// count as the run's result.
//
// Run returns an error (and emits no synthetic result) when the sandbox was
// unavailable (errors.Is(err, sandbox.ErrUnavailable): retry on another
// attempt), or when emit failed.
func (r *Runner) Run(ctx context.Context, req Request, emit EmitFunc) (Outcome, error) {
	if req.Sandbox == nil || req.Job == nil {
		return Outcome{}, errors.New("agent: Request needs a Sandbox and a Job")
	}
	log := r.cfg.Logger.With().Str("component", "agent").Str("query_id", req.Job.ID).Logger()
	start := time.Now()
	runCtx := ctx
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeoutCause(ctx, req.Timeout, ErrTimeout)
		defer cancel()
	}
	proc, err := req.Sandbox.Start(runCtx, r.procSpec(req))
	if err != nil {
		if errors.Is(err, sandbox.ErrUnavailable) && runCtx.Err() == nil {
			return Outcome{}, fmt.Errorf("agent: start query %s: %w", req.Job.ID, err)
		}
		reason, msg := protocol.ReasonSpawnFailed, "worker: the agent could not be started: "+err.Error()
		if c := stopCause(runCtx); c != nil {
			if errors.Is(c, ErrHandback) {
				return Outcome{HandedBack: true}, nil
			}
			reason, msg = reasonFor(c)
		}
		log.Warn().Err(err).Str("reason", reason).Msg("agent did not start")
		return r.synthesize(emit, Outcome{}, protocol.SyntheticInput{
			Reason: reason, DurationMS: time.Since(start).Milliseconds(), Message: msg,
		})
	}
	s := &supervisor{r: r, ctx: ctx, proc: proc, log: log}
	rr, wr := s.watch(runCtx, emit)
	return r.conclude(req, rr, wr, s.stopReason, start, emit, log)
}

// procSpec is the one place the one-shot agent's process is specified:
// its argv from the command and the job's options, the environment the
// job adds (the sandbox adds what the worker allows), the prompt on stdin.
func (r *Runner) procSpec(req Request) sandbox.ProcSpec {
	return sandbox.ProcSpec{
		ID:              cmp.Or(req.ProcID, "agent"),
		Argv:            BuildArgv(r.cfg.Command, req.Job.Options),
		Env:             req.Env,
		Stdin:           []byte(req.Job.Prompt),
		StderrTailBytes: r.cfg.StderrTailBytes,
	}
}

type waitResult struct {
	status sandbox.ExitStatus
	err    error
}

// supervisor watches one agent process to its end and stops it, once,
// when the run decides so.
type supervisor struct {
	r    *Runner
	ctx  context.Context
	proc sandbox.Process
	log  zerolog.Logger
	// decided is set, before any signal is sent, once the run is being
	// stopped for a reason other than its own result.
	decided    atomic.Bool
	stopOnce   sync.Once
	stopWG     sync.WaitGroup
	stopReason error
}

// stop stops the process group, once, for why.
func (s *supervisor) stop(why error) {
	s.stopOnce.Do(func() {
		s.stopReason = why
		if !errors.Is(why, errResultGrace) {
			s.decided.Store(true)
		}
		s.stopWG.Go(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.r.cfg.KillGrace+30*time.Second)
			defer cancel()
			if err := s.proc.Stop(sctx, s.r.cfg.KillGrace); err != nil && !errors.Is(err, sandbox.ErrExited) {
				s.log.Warn().Err(err).Msg("stopping the agent")
			}
		})
	})
}

// watch reads the process's stdout to EOF (emitting every line in order)
// and waits for its exit status, stopping it after ResultGrace past its
// last result, when its output is too large, when runCtx ends, or when
// emit fails. It returns once both are in and any stop has finished.
func (s *supervisor) watch(runCtx context.Context, emit EmitFunc) (rr readerResult, wr waitResult) {
	r := s.r
	resultSeen := make(chan struct{}, 1)
	tooLarge := make(chan struct{})
	readerDone := make(chan readerResult, 1)
	go func() { readerDone <- r.read(s.proc.Stdout(), emit, resultSeen, tooLarge, &s.decided) }()
	waitDone := make(chan waitResult, 1)
	go func() {
		st, err := s.proc.Wait(context.WithoutCancel(s.ctx))
		waitDone <- waitResult{st, err}
	}()
	var (
		haveRead, haveWait bool
		grace              *time.Timer
		graceC             <-chan time.Time
		ctxDone            = runCtx.Done()
	)
	for !haveRead || !haveWait {
		select {
		case <-resultSeen:
			// After the (latest) result the process gets ResultGrace to exit.
			if grace == nil {
				grace = time.NewTimer(r.cfg.ResultGrace)
				defer grace.Stop()
			} else {
				grace.Reset(r.cfg.ResultGrace)
			}
			graceC = grace.C
		case <-graceC:
			graceC = nil
			s.log.Info().Dur("grace", r.cfg.ResultGrace).Msg("agent still running after its result; stopping it")
			s.stop(errResultGrace)
		case <-tooLarge:
			tooLarge = nil
			s.stop(errOutputTooLarge)
		case <-ctxDone:
			ctxDone = nil
			s.stop(context.Cause(runCtx))
		case rr = <-readerDone:
			haveRead = true
			if rr.emitErr != nil {
				s.stop(rr.emitErr)
			}
		case wr = <-waitDone:
			haveWait = true
		}
	}
	s.stopWG.Wait()
	return rr, wr
}

// conclude makes the run's outcome from what was read and the exit: the
// agent's own result, a hand-back, an infrastructure failure, or one
// synthetic result saying why the run ended without one.
func (r *Runner) conclude(req Request, rr readerResult, wr waitResult, cause error, start time.Time, emit EmitFunc, log zerolog.Logger) (Outcome, error) {
	out := Outcome{
		Lines:     rr.lines,
		Oversized: rr.oversized,
		SessionID: rr.sessionID,
		Result:    rr.lastResult,
	}
	if wr.err == nil {
		st := wr.status
		out.Exit = &st
	}
	if rr.emitErr != nil {
		return out, rr.emitErr
	}
	if rr.lateResults > 0 {
		log.Info().Int("results", rr.lateResults).Err(cause).Msg("the agent wrote a result after it was stopped; the stop decides the outcome")
	}
	if out.Result != nil {
		// The agent wrote its own result before it was stopped: nothing to
		// add, whatever the exit.
		return out, nil
	}
	if errors.Is(cause, ErrHandback) {
		out.HandedBack = true
		return out, nil
	}
	if cause == nil && (rr.err != nil || wr.err != nil) {
		// The output or exit status could not be learned (a remote sandbox
		// dropped away): an infrastructure failure, retried as a new attempt.
		return out, fmt.Errorf("agent: query %s: %w", req.Job.ID, errors.Join(rr.err, wr.err))
	}
	in := protocol.SyntheticInput{
		DurationMS: time.Since(start).Milliseconds(),
		SessionID:  rr.sessionID,
	}
	switch {
	case rr.tooLarge || errors.Is(cause, errOutputTooLarge):
		in.Reason = protocol.ReasonOutputTooLarge
		in.Message = fmt.Sprintf("worker: the agent's output exceeded %d bytes", r.cfg.MaxOutputBytes)
	case cause != nil && !errors.Is(cause, errResultGrace):
		in.Reason, in.Message = reasonFor(cause)
	default:
		in.Reason = protocol.ReasonProcessExit
		in.Message = "worker: the agent exited before writing a result"
	}
	exitInput(&in, out.Exit)
	log.Info().Str("reason", in.Reason).Msg("run ended without a result; writing a synthetic one")
	return r.synthesize(emit, out, in)
}

// exitInput adds the exit status to a synthetic result's input.
func exitInput(in *protocol.SyntheticInput, exit *sandbox.ExitStatus) {
	if exit == nil {
		return
	}
	in.StderrTail = exit.StderrTail
	in.Signal = exit.Signal
	if exit.Signal == "" {
		code := exit.Code
		in.ExitCode = &code
		if in.Reason == protocol.ReasonProcessExit {
			in.Message = fmt.Sprintf("worker: the agent exited with code %d before writing a result", code)
		}
	} else if in.Reason == protocol.ReasonProcessExit {
		in.Message = fmt.Sprintf("worker: the agent was killed by %s before writing a result", exit.Signal)
	}
}

var (
	errResultGrace    = errors.New("agent: still running after its result")
	errOutputTooLarge = errors.New("agent: output too large")
)

func stopCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}

// ReasonFor maps a stop cause (ErrCancelled, ErrTimeout, a deadline) to the
// synthetic result's reason and message.
func ReasonFor(cause error) (reason, message string) { return reasonFor(cause) }

func reasonFor(cause error) (reason, message string) {
	var se StallError
	switch {
	case errors.As(cause, &se):
		return protocol.ReasonStalled, se.Error()
	case errors.Is(cause, ErrStalled):
		return protocol.ReasonStalled, "worker: the agent stalled (no output for its stall timeout)"
	case errors.Is(cause, ErrTimeout), errors.Is(cause, context.DeadlineExceeded):
		return protocol.ReasonTimeout, "worker: the run exceeded its timeout"
	default:
		return protocol.ReasonCancelled, "worker: the run was cancelled"
	}
}

func (r *Runner) synthesize(emit EmitFunc, out Outcome, in protocol.SyntheticInput) (Outcome, error) {
	return EmitSynthetic(emit, out, in)
}

// EmitSynthetic emits the synthetic result line for in and records it in
// out (Result, Synthetic, Reason, Lines). Sessions share it with Run.
func EmitSynthetic(emit EmitFunc, out Outcome, in protocol.SyntheticInput) (Outcome, error) {
	line := protocol.SyntheticResult(in)
	msg := protocol.ParseMessage(line)
	res, err := msg.AsResult()
	if err != nil {
		return out, fmt.Errorf("agent: synthetic result does not parse: %w", err)
	}
	out.Result, out.Synthetic, out.Reason = res, true, in.Reason
	if err := emit(Line{Raw: line, Msg: msg, Synthetic: true}); err != nil {
		return out, err
	}
	out.Lines++
	return out, nil
}

// read drains stdout to EOF, emitting every line. After an emit error it
// keeps draining (without emitting) so the child never blocks on a full pipe
// until it is killed.
func (r *Runner) read(stdout io.Reader, emit EmitFunc, resultSeen chan<- struct{}, tooLarge chan<- struct{}, decided *atomic.Bool) readerResult {
	var (
		res   readerResult
		total int64
		lr    = protocol.NewLineReader(stdout, r.cfg.MaxLine)
	)
	for {
		line, err := lr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = fmt.Errorf("agent: read stdout: %w", err)
			}
			break
		}
		if res.emitErr != nil || res.tooLarge {
			continue // draining only
		}
		total += int64(len(line)) + 1
		if total > r.cfg.MaxOutputBytes {
			res.tooLarge = true
			close(tooLarge)
			continue
		}
		msg := protocol.ParseMessage(line)
		if res.sessionID == "" && msg.SessionID != "" {
			res.sessionID = msg.SessionID
		}
		if msg.IsResult() && decided.Load() {
			res.lateResults++
		} else if msg.IsResult() {
			if v, err := msg.AsResult(); err == nil {
				res.lastResult = v
			} else {
				// A "result" we cannot read is still a result line: keep it
				// and record it as an error result.
				res.lastResult = &protocol.Result{Subtype: msg.Subtype, IsError: true, Errors: []string{"worker: unreadable result line: " + err.Error()}}
			}
			select {
			case resultSeen <- struct{}{}:
			default:
			}
		}
		if err := emit(Line{Raw: line, Msg: msg}); err != nil {
			res.emitErr = err
			continue
		}
		res.lines++
	}
	res.oversized = lr.Oversized()
	lr.Release() // emit keeps no line (EmitFunc), and neither does res
	return res
}
