package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

const (
	// cfStdoutBuffer is how much stdout is held between the stream and a
	// slow reader of Process.Stdout (like an OS pipe buffer). Past that the
	// stream stops being read, which back-pressures the bridge.
	cfStdoutBuffer = 64 << 10
	// cfStopPoll is how often Stop asks the bridge whether the process
	// has exited.
	cfStopPoll = 100 * time.Millisecond
)

// cfProcess is a process running behind the bridge.
type cfProcess struct {
	s      *cfSandbox
	id     string
	log    zerolog.Logger
	stdout *cfPipe
	stderr io.Writer   // ProcSpec.Stderr, may be nil
	tail   *tailBuffer // shared with Local: trims a cut UTF-8 rune

	done   chan struct{} // closed once result/err are set
	result ExitStatus
	err    error

	// delivered counts the bytes of stdout ([0]) and stderr ([1]) passed
	// on; only the follow goroutine touches it.
	delivered [2]int64
}

var _ Process = (*cfProcess)(nil)

func newCFProcess(s *cfSandbox, spec ProcSpec) *cfProcess {
	return &cfProcess{
		s:      s,
		id:     spec.ID,
		log:    s.c.log.With().Str("sandbox_id", s.id).Str("proc_id", spec.ID).Logger(),
		stdout: newCFPipe(cfStdoutBuffer),
		stderr: spec.Stderr,
		tail:   &tailBuffer{max: cfOr(spec.StderrTailBytes, defaultStderrTailBytes)},
		done:   make(chan struct{}),
	}
}

func cfOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// ID returns the process ID given in ProcSpec.
func (p *cfProcess) ID() string { return p.id }

// Stdout streams stdout; it ends with io.EOF after the bridge's exit event,
// or with the error Wait returns if the process could not be followed.
func (p *cfProcess) Stdout() io.Reader { return p.stdout }

// Wait waits for the bridge's exit event. Without one (the bridge could not
// be reached again, the process vanished, an error event) it returns an
// error wrapping ErrUnavailable. A process of a destroyed sandbox whose exit
// event never came is reported killed by SIGKILL.
func (p *cfProcess) Wait(ctx context.Context) (ExitStatus, error) {
	select {
	case <-p.done:
		return p.result, p.err
	case <-ctx.Done():
		return ExitStatus{}, fmt.Errorf("cloudflare: sandbox %s: wait %s: %w", p.s.id, p.id, ctx.Err())
	}
}

// exited reports whether the exit event has been seen.
func (p *cfProcess) exited() bool {
	select {
	case <-p.done:
		return p.err == nil
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to grace for the process to exit, then sends
// SIGKILL and waits (bounded by ctx) for it to end. If ctx ends during the
// grace period the process is killed and ctx's error returned. It returns
// ErrExited if the process had already exited.
func (p *cfProcess) Stop(ctx context.Context, grace time.Duration) error {
	if p.exited() {
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: %w", p.s.id, p.id, ErrExited)
	}
	killed, err := p.s.kill(ctx, p.id, "SIGTERM")
	if err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: %w", p.s.id, p.id, err)
	}
	if !killed {
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: %w", p.s.id, p.id, ErrExited)
	}
	if p.waitExit(ctx, grace) {
		return nil
	}
	if ctx.Err() != nil {
		// As with Local: a Stop cut short still leaves the process killed.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.s.c.cfg.RequestTimeout)
		_, _ = p.s.kill(kctx, p.id, "SIGKILL")
		cancel()
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: %w", p.s.id, p.id, ctx.Err())
	}
	p.log.Debug().Dur("grace", grace).Msg("process outlived its grace period, sending SIGKILL")
	killed, err = p.s.kill(ctx, p.id, "SIGKILL")
	if err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: kill: %w", p.s.id, p.id, err)
	}
	if killed && !p.waitExit(ctx, -1) {
		return fmt.Errorf("cloudflare: sandbox %s: stop %s: waiting after SIGKILL: %w", p.s.id, p.id, ctx.Err())
	}
	return nil
}

// waitExit waits up to d (forever if d < 0, always bounded by ctx) for the
// process to end, as seen by the stream or by the bridge's status.
func (p *cfProcess) waitExit(ctx context.Context, d time.Duration) bool {
	var deadline <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(cfStopPoll)
	defer tick.Stop()
	done := p.done
	for {
		select {
		case <-done:
			if p.err == nil {
				return true
			}
			done = nil // the stream gave up; only the status can tell
			continue
		case <-deadline:
			return false
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if st, err := p.s.status(ctx, p.id); err == nil && st.terminal() {
			return true
		}
	}
}

// watch kills the process when the ctx given to Start ends first, and
// unblocks the follower when the sandbox is destroyed.
func (p *cfProcess) watch(startCtx context.Context) {
	select {
	case <-p.done:
		return
	case <-p.s.life.Done():
		p.stdout.CloseRead(ErrClosed)
		return
	case <-startCtx.Done():
	}
	p.log.Debug().Msg("start context ended, killing the process")
	kctx, cancel := context.WithTimeout(p.s.life, p.s.c.cfg.RequestTimeout*time.Duration(p.s.c.cfg.Attempts))
	if _, err := p.s.kill(kctx, p.id, "SIGKILL"); err != nil && !errors.Is(err, ErrNotFound) {
		p.log.Warn().Err(err).Msg("kill after start context ended failed")
	}
	cancel()
	select {
	case <-p.done:
	case <-p.s.life.Done():
		p.stdout.CloseRead(ErrClosed)
	}
}

// follow follows the process's stream until its exit event or until it is
// given up, then publishes the result.
func (p *cfProcess) follow() {
	st, err := p.followLoop(p.s.life)
	if err != nil {
		st = ExitStatus{Code: -1}
	}
	st.StderrTail = p.tail.String()
	p.result, p.err = st, err
	if err != nil {
		p.stdout.CloseWrite(err)
	} else {
		p.stdout.CloseWrite(io.EOF)
	}
	close(p.done)
}

// cfFatal marks a stream error that re-attaching cannot fix.
type cfFatal struct{ err error }

func (f *cfFatal) Error() string { return f.err.Error() }
func (f *cfFatal) Unwrap() error { return f.err }

func (p *cfProcess) followLoop(ctx context.Context) (ExitStatus, error) {
	cfg := p.s.c.cfg
	failures := 0
	for {
		st, progressed, err := p.attach(ctx)
		if err == nil {
			return st, nil
		}
		if ctx.Err() != nil || p.s.isClosed() {
			return p.destroyed(err)
		}
		if f := (*cfFatal)(nil); errors.As(err, &f) {
			return ExitStatus{}, fmt.Errorf("cloudflare: sandbox %s: process %s: %w", p.s.id, p.id, f.err)
		}
		if progressed {
			failures = 0
		}
		failures++
		if failures >= cfg.StreamRetries {
			return ExitStatus{}, fmt.Errorf("cloudflare: sandbox %s: process %s: %w: no exit event after %d stream attempts (stdout %d, stderr %d bytes delivered; last error: %v)",
				p.s.id, p.id, ErrUnavailable, failures, p.delivered[0], p.delivered[1], err)
		}
		p.log.Warn().Err(err).Int("attempt", failures).Int64("stdout_off", p.delivered[0]).Int64("stderr_off", p.delivered[1]).
			Msg("exec stream dropped, reconciling and re-attaching")
		st2, serr := p.s.status(ctx, p.id)
		switch {
		case serr == nil && st2.terminal():
			continue // it has exited: the rest of its output and its exit event are waiting
		case errors.Is(serr, ErrNotFound):
			if p.s.isClosed() {
				return p.destroyed(serr)
			}
			return ExitStatus{}, fmt.Errorf("cloudflare: sandbox %s: process %s: %w: the bridge no longer knows the process (sandbox gone or replaced): %v",
				p.s.id, p.id, ErrUnavailable, serr)
		case errors.Is(serr, ErrInvalid):
			return ExitStatus{}, fmt.Errorf("cloudflare: sandbox %s: process %s: status: %w", p.s.id, p.id, serr)
		}
		if !cfSleep(ctx, cfg.Backoff.delay(failures-1)) {
			return p.destroyed(ctx.Err())
		}
	}
}

// destroyed is the outcome of a process whose sandbox was destroyed before
// its exit event arrived: Destroy killed it, so it is reported killed by
// SIGKILL (never as a success).
func (p *cfProcess) destroyed(cause error) (ExitStatus, error) {
	p.log.Debug().AnErr("stream_error", cause).Msg("sandbox destroyed before the exit event; reporting the process killed")
	return ExitStatus{Code: -1, Signal: "SIGKILL"}, nil
}

// cfActivityReader re-arms the stream's read deadline whenever bytes arrive
// (an output chunk or a ": ping").
type cfActivityReader struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
}

func (a *cfActivityReader) Read(b []byte) (int, error) {
	n, err := a.r.Read(b)
	if n > 0 {
		a.timer.Reset(a.d)
	}
	return n, err
}

// attach opens the stream once, resuming at the delivered offsets, and
// passes on new bytes until the exit event or a failure. progressed reports
// whether anything new was delivered.
func (p *cfProcess) attach(ctx context.Context) (st ExitStatus, progressed bool, err error) {
	c := p.s.c
	d := c.cfg.PingTimeout
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stalled atomic.Bool
	timer := time.AfterFunc(d, func() {
		stalled.Store(true)
		cancel()
	})
	defer timer.Stop()
	stalledErr := func(err error) error {
		if stalled.Load() {
			return fmt.Errorf("%w: exec stream silent for %s (no ping): %w", ErrUnavailable, d, err)
		}
		return err
	}

	path := p.s.path("/proc/" + p.id + "/stream")
	req, err := c.newRequest(cctx, http.MethodGet, path, cfStreamQuery(p.delivered), "", nil)
	if err != nil {
		return st, false, &cfFatal{err}
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.client.Do(req)
	if err != nil {
		return st, false, stalledErr(fmt.Errorf("%w: GET %s: %w", ErrUnavailable, path, cfStripURL(err)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		serr := fmt.Errorf("GET %s: %w", path, cfStatusError(resp.StatusCode, b))
		if errors.Is(serr, ErrInvalid) {
			return st, false, &cfFatal{serr}
		}
		return st, false, serr // 404 and 5xx: reconciled by the caller
	}
	sr := newSSEReader(&cfActivityReader{r: resp.Body, timer: timer, d: d}, cfMaxEventBytes)
	for {
		ev, err := sr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return st, progressed, fmt.Errorf("%w: exec stream ended without an exit event", ErrUnavailable)
			}
			return st, progressed, stalledErr(fmt.Errorf("%w: read exec stream: %w", ErrUnavailable, cfStripURL(err)))
		}
		switch ev.Event {
		case sseOut:
			ch, err := cfDecodeOut(ev.Data)
			if err != nil {
				return st, progressed, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			have := p.delivered[ch.fd-1]
			if ch.off > have {
				return st, progressed, fmt.Errorf("%w: exec stream skipped bytes: fd %d chunk at %d, delivered %d", ErrUnavailable, ch.fd, ch.off, have)
			}
			skip := have - ch.off
			if skip >= int64(len(ch.data)) {
				continue // already delivered (replay overlap)
			}
			data := ch.data[skip:]
			timer.Stop() // a slow reader of Stdout is not a dead stream
			werr := p.deliver(ch.fd, data)
			timer.Reset(d)
			if werr != nil {
				return st, progressed, &cfFatal{fmt.Errorf("deliver stdout: %w", werr)}
			}
			p.delivered[ch.fd-1] += int64(len(data))
			progressed = true
		case sseExit:
			st, err := cfDecodeExit(ev.Data)
			if err != nil {
				return st, progressed, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return st, progressed, nil
		case sseError:
			return st, progressed, &cfFatal{fmt.Errorf("%w: %w", ErrUnavailable, cfDecodeError(ev.Data))}
		default:
			// Unknown events are ignored (forward compatible).
		}
	}
}

// deliver passes a chunk on: stdout to the pipe (blocking while it is
// full), stderr to ProcSpec.Stderr and the tail.
func (p *cfProcess) deliver(fd int, data []byte) error {
	if fd == 1 {
		_, err := p.stdout.Write(data)
		return err
	}
	_, _ = p.tail.Write(data)
	if p.stderr != nil {
		_, _ = p.stderr.Write(data)
	}
	return nil
}

// cfPipe is an in-memory pipe holding at most limit bytes: Write blocks
// while it is full. CloseWrite makes Read return its error once drained;
// CloseRead makes Write (and Read) fail at once.
type cfPipe struct {
	mu       sync.Mutex
	buf      []byte
	limit    int
	werr     error // set by CloseWrite
	rerr     error // set by CloseRead
	readable chan struct{}
	writable chan struct{}
}

func newCFPipe(limit int) *cfPipe {
	return &cfPipe{limit: limit, readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func cfSignal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (p *cfPipe) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		p.mu.Lock()
		if p.rerr != nil {
			p.mu.Unlock()
			return n, p.rerr
		}
		if p.werr != nil {
			p.mu.Unlock()
			return n, io.ErrClosedPipe
		}
		if space := p.limit - len(p.buf); space > 0 {
			k := min(space, len(b))
			p.buf = append(p.buf, b[:k]...)
			b, n = b[k:], n+k
			cfSignal(p.readable)
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		<-p.writable
	}
	return n, nil
}

func (p *cfPipe) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		p.mu.Lock()
		if p.rerr != nil {
			p.mu.Unlock()
			return 0, p.rerr
		}
		if len(p.buf) > 0 {
			k := copy(b, p.buf)
			p.buf = p.buf[:copy(p.buf, p.buf[k:])]
			cfSignal(p.writable)
			if len(p.buf) > 0 {
				cfSignal(p.readable)
			}
			p.mu.Unlock()
			return k, nil
		}
		if p.werr != nil {
			p.mu.Unlock()
			return 0, p.werr
		}
		p.mu.Unlock()
		<-p.readable
	}
}

// CloseWrite ends the stream: readers get err (io.EOF for a clean end)
// after the buffered bytes.
func (p *cfPipe) CloseWrite(err error) {
	p.mu.Lock()
	if p.werr == nil {
		p.werr = err
	}
	p.mu.Unlock()
	cfSignal(p.readable)
}

// CloseRead abandons the stream: writers and readers get err.
func (p *cfPipe) CloseRead(err error) {
	p.mu.Lock()
	if p.rerr == nil {
		p.rerr = err
	}
	p.mu.Unlock()
	cfSignal(p.writable)
	cfSignal(p.readable)
}
