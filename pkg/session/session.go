package session

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Errors. Compare with errors.Is.
var (
	// ErrNotInteractive: the sandbox has no Interactive ability.
	ErrNotInteractive = errors.New("session: the sandbox cannot hold a process's stdin open")
	// ErrExited: the process is gone; the session takes no more turns.
	ErrExited = errors.New("session: the agent process has exited")
	// ErrUnknownRequest: Respond named no pending permission request.
	ErrUnknownRequest = errors.New("session: no such pending permission request")
)

// InputArgs are the flags that make Claude Code read turns from stdin.
var InputArgs = []string{"--input-format", "stream-json", "--replay-user-messages"}

// PromptToolArgs relay permission requests over stdin/stdout.
var PromptToolArgs = []string{"--permission-prompt-tool", "stdio"}

// Config configures sessions.
type Config struct {
	// Command is the agent program and its fixed leading args. Required.
	Command []string
	// ExitGrace is how long the process may take to exit after Close closed
	// its stdin before its group is stopped. Defaults to 10s.
	ExitGrace time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL. Defaults to 5s.
	KillGrace time.Duration
	// MaxLine caps one stdout line. Defaults to protocol.DefaultMaxLine.
	MaxLine int
	// StderrTailBytes is how much stderr is kept. Defaults to 8 KiB.
	StderrTailBytes int
	// Logger; nil is Nop.
	Logger *zerolog.Logger
	// MaxFilesBytes bounds a session's files in a checkpoint (SaveMax).
	// Defaults to DefaultMaxFilesBytes.
	MaxFilesBytes int64
}

func (c Config) withDefaults() Config {
	c.ExitGrace = cmp.Or(c.ExitGrace, 10*time.Second)
	c.KillGrace = cmp.Or(c.KillGrace, 5*time.Second)
	c.MaxLine = cmp.Or(c.MaxLine, protocol.DefaultMaxLine)
	c.StderrTailBytes = cmp.Or(c.StderrTailBytes, 8<<10)
	c.MaxFilesBytes = c.FilesLimit()
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// FilesLimit is MaxFilesBytes, defaulted.
func (c Config) FilesLimit() int64 { return cmp.Or(c.MaxFilesBytes, DefaultMaxFilesBytes) }

// Spec is one session's process.
type Spec struct {
	// Sandbox to run in; it must implement sandbox.Interactive. Required.
	Sandbox sandbox.Sandbox
	// Job supplies the options (flags). Its prompt is not written: the
	// caller sends it as the first Turn. Required.
	Job *protocol.Job
	// Env is extra environment for the agent, already filtered.
	Env map[string]string
	// ProcID names the process. Defaults to "session".
	ProcID string
	// Resume, when set, is the Claude session id to continue
	// (--resume=<id>); it replaces Job.Options.Resume.
	Resume string
	// OnRequest, if set, is called (from the reading goroutine, after the
	// line was emitted) for every permission request the agent writes.
	OnRequest func(Request)
}

// Request is a permission request of the agent (control_request of subtype
// can_use_tool).
type Request struct {
	RequestID string
	ToolName  string
	Input     json.RawMessage
}

// Input is one user turn.
type Input struct {
	Text string
	// UUID, optional, becomes the user message's uuid.
	UUID string
}

// Session is one running agent process. Turn, Interrupt, Respond and Close
// may be called from different goroutines; Turn calls must not overlap.
type Session struct {
	cfg  Config
	proc sandbox.InteractiveProcess
	emit agent.EmitFunc
	log  zerolog.Logger
	spec Spec

	wmu sync.Mutex // orders writes to stdin

	results    chan *protocol.Result
	readerDone chan struct{}
	rr         readResult // valid once readerDone is closed
	waitDone   chan struct{}
	exit       *sandbox.ExitStatus // valid once waitDone is closed

	mu        sync.Mutex
	sessionID string
	pending   map[string]Request
	turns     int

	stopOnce sync.Once
	stopWG   sync.WaitGroup
	reqSeq   atomic.Uint64
	started  time.Time
}

type readResult struct {
	err     error
	emitErr error
	lines   uint64
}

// Start starts the agent process for spec. The process waits for its first
// Turn. Errors: ErrNotInteractive, errors of sandbox Start (ErrUnavailable is
// worth retrying; a *sandbox.SpawnError or ErrInvalid is not).
func Start(ctx context.Context, cfg Config, spec Spec, emit agent.EmitFunc) (*Session, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("session: Config.Command must name the agent program")
	}
	if spec.Sandbox == nil || spec.Job == nil {
		return nil, errors.New("session: Spec needs a Sandbox and a Job")
	}
	isb, ok := spec.Sandbox.(sandbox.Interactive)
	if !ok {
		return nil, ErrNotInteractive
	}
	opts := spec.Job.Options
	if spec.Resume != "" {
		opts.Resume = spec.Resume
	}
	argv := agent.BuildArgv(cfg.Command, opts)
	argv = append(argv, InputArgs...)
	if spec.Job.Session.RemoteApprovals() {
		argv = append(argv, PromptToolArgs...)
	}
	proc, err := isb.StartInteractive(ctx, sandbox.ProcSpec{
		ID:              cmp.Or(spec.ProcID, "session"),
		Argv:            argv,
		Env:             spec.Env,
		StderrTailBytes: cfg.StderrTailBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("session: start query %s: %w", spec.Job.ID, err)
	}
	return newSession(cfg, spec, proc, emit, opts.Resume), nil
}

// SessionID is the agent's session id: from its first init line, or the
// resumed one before that.
func (s *Session) SessionID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionID
}

// Turns counts the turns that ended.
func (s *Session) Turns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns
}

// Pending returns the permission requests not answered yet.
func (s *Session) Pending() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, 0, len(s.pending))
	for _, r := range s.pending {
		out = append(out, r)
	}
	return out
}

// Exited is closed once the process's output is drained (it exited or was
// stopped).
func (s *Session) Exited() <-chan struct{} { return s.readerDone }

// Turn writes in as one user message and waits for the turn's result.
//
// It ends in one of these ways:
//   - the agent wrote a result: Outcome.Result is it.
//   - the process died before a result: a synthetic result
//     (process_exit) is emitted; the session has ended (Exited is closed).
//   - ctx is cancelled with agent.ErrHandback: the process is stopped,
//     Outcome.HandedBack is set, nothing more is emitted.
//   - ctx is cancelled for another cause (agent.ErrCancelled, a deadline):
//     the process is stopped and a synthetic result for the cause is emitted.
//
// It returns an error when emit failed, or when the output could not be read.
func (s *Session) Turn(ctx context.Context, in Input) (agent.Outcome, error) {
	select {
	case <-s.readerDone:
		return agent.Outcome{}, ErrExited
	default:
	}
	// A result nobody waited for belongs to no turn of ours.
	for len(s.results) > 0 {
		<-s.results
	}
	start := time.Now()
	line, err := userLine(in)
	if err == nil {
		err = s.write(line)
	}
	if err != nil && !errors.Is(err, ErrExited) {
		return agent.Outcome{}, err
	}
	for {
		select {
		case r := <-s.results:
			s.mu.Lock()
			s.turns++
			s.mu.Unlock()
			return agent.Outcome{Result: r, SessionID: s.SessionID()}, nil
		case <-s.readerDone:
			select {
			case r := <-s.results:
				s.mu.Lock()
				s.turns++
				s.mu.Unlock()
				return agent.Outcome{Result: r, SessionID: s.SessionID()}, nil
			default:
			}
			return s.ended(nil, start)
		case <-ctx.Done():
			cause := context.Cause(ctx)
			s.stop()
			<-s.readerDone
			return s.ended(cause, start)
		}
	}
}

// ended finishes a turn whose process is gone (or stopped for cause).
func (s *Session) ended(cause error, start time.Time) (agent.Outcome, error) {
	s.stopWG.Wait()
	<-s.waitDone
	out := agent.Outcome{SessionID: s.SessionID(), Exit: s.exit}
	if s.rr.emitErr != nil {
		return out, s.rr.emitErr
	}
	if errors.Is(cause, agent.ErrHandback) {
		out.HandedBack = true
		return out, nil
	}
	if cause == nil && s.rr.err != nil {
		return out, fmt.Errorf("session: query %s: %w", s.spec.Job.ID, s.rr.err)
	}
	in := protocol.SyntheticInput{
		DurationMS: time.Since(start).Milliseconds(),
		SessionID:  out.SessionID,
		Reason:     protocol.ReasonProcessExit,
		Message:    "worker: the agent exited before the turn's result",
	}
	if cause != nil {
		in.Reason, in.Message = agent.ReasonFor(cause)
	}
	if s.exit != nil {
		in.StderrTail, in.Signal = s.exit.StderrTail, s.exit.Signal
		if s.exit.Signal == "" {
			code := s.exit.Code
			in.ExitCode = &code
		}
	}
	s.mu.Lock()
	s.turns++
	s.mu.Unlock()
	return agent.EmitSynthetic(s.emit, out, in)
}

// Interrupt asks the agent to end the running turn. The turn then ends
// with the agent's own (error) result.
func (s *Session) Interrupt() error {
	id := "fleet-interrupt-" + strconv.FormatUint(s.reqSeq.Add(1), 10)
	b, err := json.Marshal(map[string]any{
		"type": "control_request", "request_id": id,
		"request": map[string]any{"subtype": "interrupt"},
	})
	if err != nil {
		return err
	}
	return s.write(b)
}

// Respond answers the pending permission request requestID. On allow the
// tool runs with updatedInput (nil: the input the agent asked for); on deny
// message tells the model why. Errors: ErrUnknownRequest, ErrExited.
func (s *Session) Respond(requestID string, allow bool, message string, updatedInput map[string]any) error {
	s.mu.Lock()
	req, ok := s.pending[requestID]
	if ok {
		delete(s.pending, requestID)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, requestID)
	}
	var answer map[string]any
	if allow {
		var in any = updatedInput
		if updatedInput == nil {
			in = req.Input
			if len(req.Input) == 0 {
				in = map[string]any{}
			}
		}
		answer = map[string]any{"behavior": "allow", "updatedInput": in}
	} else {
		answer = map[string]any{"behavior": "deny", "message": cmp.Or(message, "denied by the user")}
	}
	b, err := json.Marshal(map[string]any{
		"type": "control_response",
		"response": map[string]any{
			"subtype": "success", "request_id": requestID, "response": answer,
		},
	})
	if err != nil {
		return err
	}
	return s.write(b)
}

// Close ends the session: stdin is closed, the process gets ExitGrace to
// exit, then its group is stopped. It returns once the output is drained.
// Safe to call more than once.
func (s *Session) Close(ctx context.Context) error {
	s.wmu.Lock()
	_ = s.proc.Stdin().Close()
	s.wmu.Unlock()
	t := time.NewTimer(s.cfg.ExitGrace)
	defer t.Stop()
	select {
	case <-s.readerDone:
	case <-t.C:
		s.log.Info().Dur("grace", s.cfg.ExitGrace).Msg("agent still running after stdin closed; stopping it")
		s.stop()
	case <-ctx.Done():
		s.stop()
	}
	<-s.readerDone
	s.stopWG.Wait()
	<-s.waitDone
	return nil
}

// ExitStatus is the process's exit status once it exited (nil before).
func (s *Session) ExitStatus() *sandbox.ExitStatus {
	select {
	case <-s.waitDone:
		return s.exit
	default:
		return nil
	}
}

func (s *Session) stop() {
	s.stopOnce.Do(func() {
		s.stopWG.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.KillGrace+30*time.Second)
			defer cancel()
			if err := s.proc.Stop(ctx, s.cfg.KillGrace); err != nil && !errors.Is(err, sandbox.ErrExited) {
				s.log.Warn().Err(err).Msg("stopping the agent")
			}
		})
	})
}

// write writes one line to stdin.
func (s *Session) write(line []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case <-s.readerDone:
		return ErrExited
	default:
	}
	if _, err := s.proc.Stdin().Write(append(line, '\n')); err != nil {
		if errors.Is(err, sandbox.ErrExited) {
			return fmt.Errorf("%w: %v", ErrExited, err) //nolint:errorlint // callers match the session's ErrExited; the sandbox's error is its text
		}
		return fmt.Errorf("session: write stdin: %w", err)
	}
	return nil
}

func userLine(in Input) ([]byte, error) {
	m := map[string]any{
		"type":               "user",
		"message":            map[string]any{"role": "user", "content": in.Text},
		"parent_tool_use_id": nil,
		"session_id":         "",
	}
	if in.UUID != "" {
		m["uuid"] = in.UUID
	}
	return json.Marshal(m)
}

// controlRequest is the part of a control_request line the session reads.
type controlRequest struct {
	Type      string `json:"type"`
	RequestID string `json:"request_id"`
	Request   struct {
		Subtype  string          `json:"subtype"`
		ToolName string          `json:"tool_name"`
		Input    json.RawMessage `json:"input"`
	} `json:"request"`
}

// ParseRequest reads a permission request line (control_request of subtype
// can_use_tool); ok is false for any other line.
func ParseRequest(line []byte) (Request, bool) {
	var cr controlRequest
	if json.Unmarshal(line, &cr) != nil || cr.Type != "control_request" || cr.Request.Subtype != "can_use_tool" || cr.RequestID == "" {
		return Request{}, false
	}
	return Request{RequestID: cr.RequestID, ToolName: cr.Request.ToolName, Input: cr.Request.Input}, true
}

// read drains stdout, emitting every line and noting results, the session
// id and permission requests. After an emit error it keeps draining.
func (s *Session) read(stdout io.Reader) readResult {
	var res readResult
	lr := protocol.NewLineReader(stdout, s.cfg.MaxLine)
	defer lr.Release() // nothing keeps a line past the next read
	for {
		line, err := lr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				res.err = fmt.Errorf("session: read stdout: %w", err)
			}
			return res
		}
		if res.emitErr != nil {
			continue
		}
		msg := protocol.ParseMessage(line)
		if msg.SessionID != "" && msg.Type == protocol.TypeSystem {
			s.mu.Lock()
			s.sessionID = msg.SessionID
			s.mu.Unlock()
		}
		var req Request
		isReq := false
		if msg.Type == "control_request" {
			if req, isReq = ParseRequest(line); isReq {
				s.mu.Lock()
				s.pending[req.RequestID] = req
				s.mu.Unlock()
			}
		}
		if msg.Type == "control_cancel_request" {
			var c struct {
				RequestID string `json:"request_id"`
			}
			if json.Unmarshal(line, &c) == nil {
				s.mu.Lock()
				delete(s.pending, c.RequestID)
				s.mu.Unlock()
			}
		}
		if err := s.emit(agent.Line{Raw: line, Msg: msg}); err != nil {
			res.emitErr = err
			s.stop()
			continue
		}
		res.lines++
		if msg.IsResult() {
			r, err := msg.AsResult()
			if err != nil {
				r = &protocol.Result{Subtype: msg.Subtype, IsError: true, Errors: []string{"worker: unreadable result line: " + err.Error()}}
			}
			select {
			case s.results <- r:
			default:
				s.log.Warn().Msg("results are piling up with no turn waiting; dropping one")
			}
		}
		if isReq && s.spec.OnRequest != nil {
			s.spec.OnRequest(req)
		}
	}
}
