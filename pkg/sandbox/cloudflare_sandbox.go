package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cfSandbox is a sandbox behind the bridge.
type cfSandbox struct {
	c   *Cloudflare
	id  string
	env map[string]string // Spec.Env, resent with every process

	// life is cancelled once the sandbox is destroyed; it stops the
	// goroutines following its processes.
	life   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // process goroutines
}

var _ Sandbox = (*cfSandbox)(nil)

// ID returns the sandbox's name.
func (s *cfSandbox) ID() string { return s.id }

func (s *cfSandbox) path(rest string) string { return "/v1/sb/" + s.id + rest }

// WriteFile writes data to path in the workspace (PUT /file, retried).
func (s *cfSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := cfCheckPath(path); err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: write file: %w", s.id, err)
	}
	if len(data) > cfMaxFileBytes {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path,
			Invalidf("%d bytes is more than the bridge's %d", len(data), cfMaxFileBytes))
	}
	if s.isClosed() {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path, ErrClosed)
	}
	if data == nil {
		data = []byte{}
	}
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, _, err := s.c.send(ctx, http.MethodPut, s.path("/file"), url.Values{"path": {path}}, "application/octet-stream", data, cfMaxJSONBytes)
		return err
	})
	if err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path, cfSandboxGone(err))
	}
	return nil
}

// ReadFile reads path from the workspace (GET /file); ErrNotFound if absent.
func (s *cfSandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	if err := cfCheckPath(path); err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file: %w", s.id, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file %s: %w", s.id, path, ErrClosed)
	}
	var data []byte
	err := s.c.retry(ctx, func(ctx context.Context) error {
		var err error
		_, data, err = s.c.send(ctx, http.MethodGet, s.path("/file"), url.Values{"path": {path}}, "", nil, cfMaxFileBytes)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file %s: %w", s.id, path, cfSandboxGone(err))
	}
	return data, nil
}

// Destroy deletes the sandbox (DELETE /v1/sb/:id, which stops every
// process), then waits, bounded by ctx, for the goroutines following its
// processes. It is idempotent: a sandbox already gone is fine.
func (s *cfSandbox) Destroy(ctx context.Context) error {
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, _, err := s.c.send(ctx, http.MethodDelete, s.path(""), nil, "", nil, cfMaxJSONBytes)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("cloudflare: destroy sandbox %s: %w", s.id, err)
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	// Followers normally end by themselves: the bridge sends the killed
	// processes' exit events, or answers 404 on re-attachment. Give them a
	// moment (at most a ping period), then stop them.
	wctx, cancel := context.WithTimeout(ctx, min(5*time.Second, s.c.cfg.PingTimeout))
	cfWaitGroup(wctx, &s.wg)
	cancel()
	s.cancel()
	if !cfWaitGroup(ctx, &s.wg) {
		return fmt.Errorf("cloudflare: destroy sandbox %s: waiting for process streams: %w", s.id, ctx.Err())
	}
	return nil
}

func (s *cfSandbox) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// cfWaitGroup waits for wg or ctx; it reports whether wg finished.
func cfWaitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// cfStartBody is the body of POST /v1/sb/:id/proc.
type cfStartBody struct {
	ProcID    string            `json:"proc_id"`
	Argv      []string          `json:"argv"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	StdinPath string            `json:"stdin_path,omitempty"`
	Stdin     string            `json:"stdin,omitempty"` // "pipe": interactive
}

// cfStartResp is the answer of POST /v1/sb/:id/proc.
type cfStartResp struct {
	ProcID string `json:"proc_id"`
	PID    int    `json:"pid"`
}

// Start starts spec in the sandbox and begins following its output. See
// Cloudflare for stdin, streaming and cancellation. Errors: ErrInvalid (bad
// spec, or the process ID already names a different process), ErrUnavailable,
// ErrClosed.
func (s *cfSandbox) Start(ctx context.Context, spec ProcSpec) (Process, error) {
	return s.start(ctx, spec, false)
}

func (s *cfSandbox) start(ctx context.Context, spec ProcSpec, interactive bool) (*cfProcess, error) {
	if err := s.checkProcSpec(spec); err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, cfClip(spec.ID, 64), err)
	}
	merged := make(map[string]string, len(s.env)+len(spec.Env))
	for k, v := range s.env {
		merged[k] = v
	}
	for k, v := range spec.Env {
		merged[k] = v
	}
	env, err := s.c.filterEnv(merged)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, ErrClosed)
	}
	body := cfStartBody{ProcID: spec.ID, Argv: spec.Argv, Cwd: spec.Dir, Env: env}
	if interactive {
		body.Stdin = "pipe"
	}
	if len(spec.Stdin) > 0 {
		body.StdinPath = cfStdinDir + "/stdin-" + spec.ID
		if err := s.WriteFile(ctx, body.StdinPath, spec.Stdin); err != nil {
			return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: stdin: %w", s.id, spec.ID, err)
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, err)
	}
	var resp cfStartResp
	err = s.c.retry(ctx, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPost, s.path("/proc"), nil, "application/json", raw, &resp)
	})
	if he := (*cfHTTPError)(nil); errors.As(err, &he) && he.Code == "spawn_failed" {
		return nil, &SpawnError{Sandbox: s.id, Process: spec.ID, Program: spec.Argv[0],
			Err: fmt.Errorf("bridge: %s", cfClip(he.Message, 300))}
	}
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, cfSandboxGone(err))
	}
	p := newCFProcess(s, spec)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, ErrClosed)
	}
	s.wg.Add(2)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		p.follow()
	}()
	go func() {
		defer s.wg.Done()
		p.watch(ctx)
	}()
	s.c.log.Debug().Str("sandbox_id", s.id).Str("proc_id", spec.ID).Int("pid", resp.PID).Msg("process started")
	return p, nil
}

func (s *cfSandbox) checkProcSpec(spec ProcSpec) error {
	if err := CheckID(spec.ID); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return Invalidf("argv is empty")
	}
	for _, a := range spec.Argv {
		if strings.ContainsRune(a, 0) {
			return Invalidf("argv contains a NUL byte")
		}
	}
	if spec.Dir != "" {
		if err := cfCheckPath(spec.Dir); err != nil {
			return fmt.Errorf("dir: %w", err)
		}
	}
	if len(spec.Stdin) > cfMaxFileBytes {
		return Invalidf("stdin is %d bytes, more than the bridge's %d", len(spec.Stdin), cfMaxFileBytes)
	}
	if spec.StderrTailBytes < 0 {
		return Invalidf("StderrTailBytes is negative")
	}
	return nil
}

// kill sends POST /kill with signal; it reports the bridge's "killed".
func (s *cfSandbox) kill(ctx context.Context, procID, signal string) (bool, error) {
	raw, _ := json.Marshal(map[string]string{"signal": signal})
	var resp struct {
		Killed bool `json:"killed"`
	}
	err := s.c.retry(ctx, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPost, s.path("/proc/"+procID+"/kill"), nil, "application/json", raw, &resp)
	})
	return resp.Killed, err
}

// cfProcStatus is the answer of GET /v1/sb/:id/proc/:proc_id.
type cfProcStatus struct {
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// terminal reports whether the status says the process has ended.
func (p cfProcStatus) terminal() bool {
	switch p.Status {
	case "completed", "failed", "killed", "error":
		return true
	}
	return false
}

// status asks the bridge for a process's status (one attempt).
func (s *cfSandbox) status(ctx context.Context, procID string) (cfProcStatus, error) {
	var st cfProcStatus
	ctx, cancel := context.WithTimeout(ctx, s.c.cfg.RequestTimeout)
	defer cancel()
	err := s.c.call(ctx, http.MethodGet, s.path("/proc/"+procID), nil, "", nil, &st)
	return st, err
}

// cfStreamQuery is the query of a stream request resuming at from.
func cfStreamQuery(from [2]int64) url.Values {
	return url.Values{"from": {strconv.FormatInt(from[0], 10) + "," + strconv.FormatInt(from[1], 10)}}
}
