package sandbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stdinReplyServer answers every request with the status and body set last.
type stdinReplyServer struct {
	mu     sync.Mutex
	status int
	body   []byte
}

func (s *stdinReplyServer) set(status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body = status, body
}

// RoundTrip answers in memory, through net/http's own response writer
// (httptest.ResponseRecorder), so fuzzing opens no sockets.
func (s *stdinReplyServer) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	status, body := s.status, s.body
	s.mu.Unlock()
	if r.Body != nil {
		_ = r.Body.Close()
	}
	rec := httptest.NewRecorder()
	rec.WriteHeader(status)
	if status != http.StatusNoContent && status != http.StatusNotModified {
		_, _ = rec.Write(body)
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// FuzzCloudflareStdinReply feeds the provider's stdin writer and closer
// arbitrary answers of the bridge's stdin routes (POST
// /v1/sb/:id/proc/:proc_id/stdin?off=N and /stdin/close), through net/http's client and response writer.
// Whatever the answer, nothing panics, a write succeeds only when the
// answer is 2xx and says the bridge applied the stream through the write's
// end ({"off": end}), a failed write changes no offset and wraps one of the
// package's sentinels, and the conflict codes map to ErrExited / ErrClosed.
func FuzzCloudflareStdinReply(f *testing.F) {
	f.Add(200, []byte(`{"off":5}`), int64(0), []byte("hello"))
	f.Add(200, []byte(`{"off":12}`), int64(7), []byte("hello"))
	f.Add(200, []byte(`{"off":4}`), int64(0), []byte("hello"))
	f.Add(200, []byte(`{}`), int64(0), []byte("x"))
	f.Add(200, []byte(`null`), int64(0), []byte("x"))
	f.Add(200, []byte(`{"off":"5"}`), int64(0), []byte("hello"))
	f.Add(200, []byte(`{"off":5.0}`), int64(0), []byte("hello"))
	f.Add(200, []byte(`{"closed":true}`), int64(0), []byte("x"))
	f.Add(409, []byte(`{"error":"process exited","code":"proc_exited"}`), int64(3), []byte("x"))
	f.Add(409, []byte(`{"error":{"code":"stdin_closed","message":"closed"}}`), int64(3), []byte("x"))
	f.Add(409, []byte(`{"error":"gap","code":"stdin_gap","off":1}`), int64(3), []byte("x"))
	f.Add(404, []byte(`{"error":"no sandbox","code":"sandbox_not_found"}`), int64(0), []byte("x"))
	f.Add(503, []byte(`{"error":"busy","code":"stdin_write_failed"}`), int64(0), []byte("x"))
	f.Add(413, []byte(`too large`), int64(0), []byte("x"))
	f.Add(401, []byte(``), int64(0), []byte("x"))
	f.Add(204, []byte(``), int64(0), []byte("x"))

	srv := &stdinReplyServer{}
	c, err := NewCloudflare(CloudflareConfig{
		BaseURL: "http://bridge.invalid", Token: "t", Attempts: 1, HTTPClient: &http.Client{Transport: srv},
		RequestTimeout: 10 * time.Second, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond},
	})
	require.NoError(f, err)
	f.Cleanup(c.Close)
	sb := c.newSandbox(Spec{ID: "fuzz"})
	f.Cleanup(sb.cancel)

	f.Fuzz(func(t *testing.T, status int, body []byte, off int64, chunk []byte) {
		if status < 200 || status > 599 || off < 0 || off > 1<<40 || len(chunk) == 0 || len(chunk) > cfStdinChunk {
			return
		}
		srv.set(status, body)
		w := &cfStdin{p: newCFProcess(sb, ProcSpec{ID: "p"}), off: off}
		end := off + int64(len(chunk))

		// What the answer says, decoded independently.
		var ack struct {
			Off *int64 `json:"off"`
		}
		ok2xx := status >= 200 && status <= 299
		if status == http.StatusNoContent || status == http.StatusNotModified {
			body = nil // no body with these
		}
		applied := ok2xx && len(body) <= cfMaxJSONBytes && json.Unmarshal(body, &ack) == nil && ack.Off != nil && *ack.Off == end

		n, err := w.Write(chunk)
		if applied {
			require.NoError(t, err)
			require.Equal(t, len(chunk), n)
			require.Equal(t, end, w.off)
		} else {
			require.Error(t, err)
			require.Zero(t, n)
			require.Equal(t, off, w.off, "a failed write moves no offset")
			require.True(t, oneOfSentinels(err), "error %v wraps no sandbox sentinel", err)
			require.Less(t, len(err.Error()), 2048, "error messages are clipped")
			if !ok2xx {
				var he *cfHTTPError
				if !errors.As(err, &he) {
					// Only "the sandbox is gone" is rewritten (and retryable).
					require.Equal(t, http.StatusNotFound, status)
					require.ErrorIs(t, err, ErrUnavailable)
					require.Contains(t, err.Error(), "sandbox_not_found")
					return
				}
				require.Equal(t, status, he.Status)
				switch he.Code {
				case "proc_exited":
					require.ErrorIs(t, err, ErrExited)
				case "stdin_closed":
					require.ErrorIs(t, err, ErrClosed)
				}
			} else {
				require.ErrorIs(t, err, ErrUnavailable, "a 2xx answer that does not confirm the write is worth retrying")
			}
		}

		cerr := w.Close()
		if ok2xx && len(body) <= cfMaxJSONBytes {
			require.NoError(t, cerr)
			require.True(t, w.closed)
			require.NoError(t, w.Close(), "a second close does nothing")
		} else if cerr != nil {
			require.False(t, w.closed)
			require.True(t, oneOfSentinels(cerr), "close error %v wraps no sandbox sentinel", cerr)
		}
	})
}

func oneOfSentinels(err error) bool {
	for _, s := range []error{ErrExited, ErrClosed, ErrUnavailable, ErrInvalid, ErrNotFound} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
