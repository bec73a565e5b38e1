package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
)

// cfStdinChunk is the largest body of one stdin write (the bridge's limit).
const cfStdinChunk = 64 << 10

// StartInteractive starts a process whose stdin stays open (the Interactive
// ability): the bridge feeds it from a FIFO in the container, appended to
// by POST /proc/:id/stdin?off=N (deploy/cloudflare/README.md "Interactive
// stdin"). ProcSpec.Stdin must be empty. Errors as Start.
func (s *cfSandbox) StartInteractive(ctx context.Context, spec ProcSpec) (InteractiveProcess, error) {
	if len(spec.Stdin) > 0 {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, cfClip(spec.ID, 64), Invalidf("an interactive process takes no ProcSpec.Stdin"))
	}
	p, err := s.start(ctx, spec, true)
	if err != nil {
		return nil, err
	}
	return &cfInteractive{cfProcess: p, stdin: &cfStdin{p: p}}, nil
}

// cfInteractive is a cfProcess with a held stdin.
type cfInteractive struct {
	*cfProcess
	stdin *cfStdin
}

func (p *cfInteractive) Stdin() io.WriteCloser { return p.stdin }

var (
	_ Interactive        = (*cfSandbox)(nil)
	_ InteractiveProcess = (*cfInteractive)(nil)
)

// cfStdin writes to the process's stdin through the bridge. Every write
// carries its byte offset in the stream, so a write retried after a lost
// answer (503, transport failure) is applied once.
type cfStdin struct {
	p *cfProcess

	mu     sync.Mutex
	off    int64 // bytes the bridge has applied
	closed bool
}

// Write sends b in chunks of at most 64 KiB, each retried while the bridge
// is unavailable. It returns an error wrapping ErrExited once the process
// has exited, ErrClosed after Close.
func (w *cfStdin) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.p.s
	op := fmt.Sprintf("cloudflare: sandbox %s: process %s: write stdin", s.id, w.p.id)
	if w.p.exited() {
		return 0, fmt.Errorf("%s: %w", op, ErrExited)
	}
	if w.closed {
		return 0, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	n := 0
	for n < len(b) {
		chunk := b[n:min(len(b), n+cfStdinChunk)]
		end := w.off + int64(len(chunk))
		var resp struct {
			Off int64 `json:"off"`
		}
		q := url.Values{"off": {strconv.FormatInt(w.off, 10)}}
		err := s.c.retry(s.life, func(ctx context.Context) error {
			return s.c.call(ctx, http.MethodPost, s.path("/proc/"+w.p.id+"/stdin"), q, "application/octet-stream", chunk, &resp)
		})
		if err != nil {
			return n, fmt.Errorf("%s: %w", op, cfStdinError(err))
		}
		if resp.Off != end {
			return n, fmt.Errorf("%s: %w", op, fmt.Errorf("%w: bridge applied %d bytes, expected %d", ErrUnavailable, resp.Off, end))
		}
		w.off = end
		n += len(chunk)
	}
	return n, nil
}

// Close sends EOF (POST /stdin/close, retried). A second Close does nothing.
func (w *cfStdin) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	s := w.p.s
	err := s.c.retry(s.life, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPost, s.path("/proc/"+w.p.id+"/stdin/close"), nil, "", nil, nil)
	})
	if err != nil && !w.p.exited() {
		return fmt.Errorf("cloudflare: sandbox %s: process %s: close stdin: %w", s.id, w.p.id, cfStdinError(err))
	}
	w.closed = true
	return nil
}

// cfStdinError maps the stdin route's conflicts to sentinels.
func cfStdinError(err error) error {
	var he *cfHTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case "proc_exited":
			return fmt.Errorf("%w: %w", ErrExited, err)
		case "stdin_closed":
			return fmt.Errorf("%w: %w", ErrClosed, err)
		}
	}
	return cfSandboxGone(err)
}
