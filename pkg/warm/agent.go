package warm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Process is a warm agent's process: a sandbox.InteractiveProcess has
// every method it needs, and tests may give any other.
type Process interface {
	// Stdin is the agent's input; each user message is one line.
	Stdin() io.WriteCloser
	// Stdout is the agent's output, one JSON object a line.
	Stdout() io.Reader
	// Wait waits for exit (or ctx); it may be called more than once.
	Wait(ctx context.Context) (sandbox.ExitStatus, error)
	// Stop stops the process: SIGTERM, grace, SIGKILL.
	Stop(ctx context.Context, grace time.Duration) error
}

// Run is the run a taken agent serves.
type Run struct {
	Tenant, ID string
}

// BindFunc binds what the spawn hook minted unbound (the gateway's run
// token) to run. It is called once, by Agent.Begin, before the agent gets
// its first input; an error leaves the agent unused (the caller closes it
// and starts cold).
type BindFunc func(ctx context.Context, run Run) error

// Spawned is what a SpawnFunc started.
type Spawned struct {
	// Process is the agent, started with Profile.Argv and waiting for its
	// first user message. Required.
	Process Process
	// Bind binds per-run state at Take; nil when there is none.
	Bind BindFunc
	// Release frees what the spawn made (destroys the sandbox, revokes the
	// token) once the process is stopped; nil when there is nothing.
	Release func(ctx context.Context) error
}

// SpawnFunc starts one agent of profile p in a sandbox of its own. It
// must put nothing of a run (job id, tenant, a token valid for a run)
// into argv or environment: see the package documentation.
type SpawnFunc func(ctx context.Context, p Profile) (Spawned, error)

// ErrBegun is returned by a second Begin.
var ErrBegun = errors.New("warm: the agent already has its run")

// Agent is one warm agent. Once taken it belongs to the taker.
type Agent struct {
	profile Profile
	sp      Spawned
	spawned time.Time
	stdout  io.Reader
	grace   time.Duration

	// unwatch ends the pool's watch of the agent's exit once it is taken.
	unwatch context.CancelFunc

	mu    sync.Mutex
	begun bool

	closeOnce sync.Once
	closeErr  error
}

// Profile is the profile the agent was started for.
func (a *Agent) Profile() Profile { return a.profile }

// Spawned is when the agent was started.
func (a *Agent) Spawned() time.Time { return a.spawned }

// Process is the agent's process. Read its output from Stdout, which may
// hold what the pool read ahead of it.
func (a *Agent) Process() Process { return a.sp.Process }

// Stdout is the agent's output from the first line after any handshake.
func (a *Agent) Stdout() io.Reader { return a.stdout }

// Stdin is the agent's input.
func (a *Agent) Stdin() io.WriteCloser { return a.sp.Process.Stdin() }

// Begin binds the agent to run and writes prompt as its first user
// message; closeInput then closes stdin (a one-shot job: the agent
// answers and exits). A session keeps stdin open for its next turns.
func (a *Agent) Begin(ctx context.Context, run Run, prompt string, closeInput bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.bind(ctx, run); err != nil {
		return err
	}
	line, err := UserLine(prompt)
	if err != nil {
		return err
	}
	in := a.sp.Process.Stdin()
	if _, err := in.Write(line); err != nil {
		return fmt.Errorf("warm: writing the first message of query %s: %w", run.ID, err)
	}
	if closeInput {
		if err := in.Close(); err != nil {
			return fmt.Errorf("warm: closing the input of query %s: %w", run.ID, err)
		}
	}
	return nil
}

// Bind binds the agent to run without writing to it: the taker writes
// the first user message itself (a session, whose turns the session
// writes). Bind or Begin, once.
func (a *Agent) Bind(ctx context.Context, run Run) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bind(ctx, run)
}

// bind is Bind with mu held.
func (a *Agent) bind(ctx context.Context, run Run) error {
	if a.begun {
		return ErrBegun
	}
	a.begun = true
	if a.sp.Bind != nil {
		if err := a.sp.Bind(ctx, run); err != nil {
			return fmt.Errorf("warm: binding the agent to query %s: %w", run.ID, err)
		}
	}
	return nil
}

// Close stops the agent (closing its stdin first, as Claude Code shuts
// down cleanly at EOF) and releases its sandbox. Idempotent.
func (a *Agent) Close(ctx context.Context) error {
	a.closeOnce.Do(func() {
		if a.unwatch != nil {
			a.unwatch()
		}
		p := a.sp.Process
		_ = p.Stdin().Close()
		err := p.Stop(ctx, a.grace)
		if errors.Is(err, sandbox.ErrExited) {
			err = nil
		}
		if a.sp.Release != nil {
			err = errors.Join(err, a.sp.Release(ctx))
		}
		a.closeErr = err
	})
	return a.closeErr
}

// UserLine is a stream-json user message carrying text, newline-ended.
func UserLine(text string) ([]byte, error) {
	b, err := json.Marshal(map[string]any{
		"type":               "user",
		"message":            map[string]any{"role": "user", "content": text},
		"parent_tool_use_id": nil,
		"session_id":         "",
	})
	if err != nil {
		return nil, fmt.Errorf("warm: %w", err)
	}
	return append(b, '\n'), nil
}

// initializeLine is Claude Code's initialize control request, as the
// Agent SDK sends it first.
var initializeLine = []byte(`{"type":"control_request","request_id":"fleet-warm-init","request":{"subtype":"initialize"}}` + "\n")

// handshake sends the initialize request and reads until its answer, so
// the agent is known to have finished starting. Lines read after the
// answer (none are expected) stay readable through the returned reader.
func handshake(p Process) (io.Reader, error) {
	if _, err := p.Stdin().Write(initializeLine); err != nil {
		return nil, fmt.Errorf("warm: handshake: %w", err)
	}
	br := bufio.NewReaderSize(p.Stdout(), 64<<10)
	for {
		line, err := readLine(br, maxHandshakeLine)
		if err != nil {
			return nil, fmt.Errorf("warm: the agent ended before answering its handshake: %w", err)
		}
		var m struct {
			Type     string `json:"type"`
			Response struct {
				RequestID string `json:"request_id"`
			} `json:"response"`
		}
		if json.Unmarshal(line, &m) == nil && m.Type == "control_response" && m.Response.RequestID == "fleet-warm-init" {
			return br, nil
		}
	}
}

// maxHandshakeLine bounds a line read during the handshake; a longer one
// is skipped (the answer is some tens of KiB).
const maxHandshakeLine = 4 << 20

// readLine reads one line of at most max bytes; a longer one comes back
// empty (skipped).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		part, err := br.ReadSlice('\n')
		if len(buf)+len(part) <= max {
			buf = append(buf, part...)
		} else {
			buf = buf[:0]
			max = -1 // skip the rest of this line
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return nil, err
		case max < 0:
			return nil, nil
		}
		return buf, nil
	}
}
