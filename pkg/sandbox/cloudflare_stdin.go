package sandbox

import (
	"context"
	"encoding/json"
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
		q := url.Values{"off": {strconv.FormatInt(w.off, 10)}}
		err := s.c.retry(s.life, func(ctx context.Context) error {
			_, body, err := s.c.send(ctx, http.MethodPost, s.path("/proc/"+w.p.id+"/stdin"), q, "application/octet-stream", chunk, cfMaxJSONBytes)
			if err != nil {
				return err
			}
			// A write the bridge applied only in part (or an answer that
			// does not decode) is sent again: the offset makes it idempotent.
			return cfStdinAck(body, end)
		})
		if err != nil {
			return n, fmt.Errorf("%s: %w", op, cfStdinError(err))
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

// cfStdinAck decodes a 2xx answer to a stdin write, {"off": <bytes
// applied>}: nil when the bridge has applied the stream through end, else
// an error wrapping ErrUnavailable (a retry of the same write is safe).
func cfStdinAck(body []byte, end int64) error {
	var resp struct {
		Off *int64 `json:"off"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("%w: stdin write: answer does not decode: %w", ErrUnavailable, err)
	}
	switch {
	case resp.Off == nil:
		return fmt.Errorf("%w: stdin write: answer carries no off", ErrUnavailable)
	case *resp.Off != end:
		return fmt.Errorf("%w: stdin write: bridge applied %d bytes, expected %d", ErrUnavailable, *resp.Off, end)
	}
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
