package sandbox

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// readEvents parses all of input.
func readEvents(input string, maxEvent int) ([]sseEvent, error) {
	r := newSSEReader(strings.NewReader(input), maxEvent)
	var evs []sseEvent
	for {
		ev, err := r.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

// writeSSE encodes events the way a bridge does, with the given line end.
func writeSSE(evs []sseEvent, eol string) string {
	var b strings.Builder
	b.WriteString(": ping" + eol + eol)
	for _, ev := range evs {
		if ev.Event != "" {
			b.WriteString("event: " + ev.Event + eol)
		}
		if ev.ID != "" {
			b.WriteString("id: " + ev.ID + eol)
		}
		for _, line := range strings.Split(ev.Data, "\n") {
			b.WriteString("data: " + line + eol)
		}
		b.WriteString(eol)
	}
	return b.String()
}

func TestSSEReaderFraming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		in    string
		want  []sseEvent
		final error
	}{
		{"bridge frames", "event: out\ndata: {\"fd\":1}\n\n: ping\n\nevent: exit\ndata: {}\n\n",
			[]sseEvent{{Event: "out", Data: `{"fd":1}`}, {Event: "exit", Data: "{}"}}, io.EOF},
		{"CRLF", "event: a\r\ndata: x\r\n\r\n", []sseEvent{{Event: "a", Data: "x"}}, io.EOF},
		{"CR", "event: a\rdata: x\r\r", []sseEvent{{Event: "a", Data: "x"}}, io.EOF},
		{"multi-line data", "data: a\ndata:b\ndata\n\n", []sseEvent{{Data: "a\nb\n"}}, io.EOF},
		{"only one space stripped", "data:  two\n\n", []sseEvent{{Data: " two"}}, io.EOF},
		{"no data no dispatch", "event: a\n\ndata: x\n\n", []sseEvent{{Data: "x"}}, io.EOF},
		{"id persists", "id: 7\ndata: a\n\ndata: b\n\n", []sseEvent{{Data: "a", ID: "7"}, {Data: "b", ID: "7"}}, io.EOF},
		{"unknown fields and retry ignored", "retry: 10\nfoo: bar\ndata: x\n\n", []sseEvent{{Data: "x"}}, io.EOF},
		{"unterminated event dropped", "event: exit\ndata: {}\n", nil, io.ErrUnexpectedEOF},
		{"unterminated line", "data: {}", nil, io.ErrUnexpectedEOF},
		{"empty", "", nil, io.EOF},
		{"comments only", ": ping\n\n: ping\n\n", nil, io.EOF},
		{"line too large", "data: " + strings.Repeat("x", 5000) + "\n\n", nil, errSSETooLarge},
		{"event too large", strings.Repeat("data: "+strings.Repeat("x", 600)+"\n", 3) + "\n", nil, errSSETooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			evs, err := readEvents(tc.in, 1024)
			require.Equal(t, tc.want, evs)
			require.ErrorIs(t, err, tc.final)
		})
	}
}

// TestSSEReaderSplitReads feeds the stream one byte per Read, so CRLF and
// lines straddle reads.
func TestSSEReaderSplitReads(t *testing.T) {
	t.Parallel()
	in := "event: out\r\ndata: 1\r\n\r\nevent: exit\rdata: 2\r\r"
	r := newSSEReader(iotestOneByte{strings.NewReader(in)}, 1024)
	var got []sseEvent
	for {
		ev, err := r.Next()
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		got = append(got, ev)
	}
	require.Equal(t, []sseEvent{{Event: "out", Data: "1"}, {Event: "exit", Data: "2"}}, got)
}

type iotestOneByte struct{ r io.Reader }

func (o iotestOneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

// FuzzSSE: the parser never panics nor returns events larger than its
// limit on any input, and events encoded as a bridge encodes them come back
// unchanged whatever the line ends.
func FuzzSSE(f *testing.F) {
	f.Add([]byte("event: out\ndata: {\"fd\":1,\"off\":0,\"b64\":\"aGk=\"}\n\n: ping\n\nevent: exit\ndata: {\"code\":0,\"status\":\"completed\"}\n\n"), "out", `{"fd":2}`, "1")
	f.Add([]byte("data: a\r\n\r\ndata: b\r\r"), "exit", "line one\nline two", "")
	f.Add([]byte(":\n\n\n\nevent\ndata\n\n"), "", "", "x")
	f.Add([]byte("\r\r\n\n\rdata:x"), "error", "{}\n\n{}", "id:with:colons")
	f.Fuzz(func(t *testing.T, raw []byte, name, data, id string) {
		const limit = 4096
		evs, err := readEvents(string(raw), limit)
		require.Error(t, err)
		for _, ev := range evs {
			require.LessOrEqual(t, len(ev.Data), limit)
		}

		if strings.ContainsAny(name, "\r\n") || strings.ContainsAny(id, "\r\n\x00") || strings.ContainsRune(data, '\r') ||
			len(name)+len(data)+len(id) > limit/2 {
			return
		}
		want := []sseEvent{{Event: name, Data: data, ID: id}, {Event: "exit", Data: data, ID: id}}
		for _, eol := range []string{"\n", "\r\n", "\r"} {
			got, err := readEvents(writeSSE(want, eol), limit)
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, want, got, "eol %q", eol)
		}
	})
}

// FuzzStreamEvent: decoding event data never panics and only accepts
// well-formed values.
func FuzzStreamEvent(f *testing.F) {
	f.Add(`{"fd":1,"off":0,"b64":"aGVsbG8="}`)
	f.Add(`{"fd":2,"off":10,"b64":""}`)
	f.Add(`{"fd":3,"off":-1,"b64":"!!"}`)
	f.Add(`{"code":0,"status":"completed"}`)
	f.Add(`{"code":137,"status":"killed"}`)
	f.Add(`{"status":"failed"}`)
	f.Add(`{"code":"exec_error","message":"boom"}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, data string) {
		if ch, err := cfDecodeOut(data); err == nil {
			require.Contains(t, []int{1, 2}, ch.fd)
			require.GreaterOrEqual(t, ch.off, int64(0))
		}
		if st, err := cfDecodeExit(data); err == nil && st.Signal != "" {
			require.Equal(t, -1, st.Code)
		}
		err := cfDecodeError(data)
		require.Error(t, err)
		require.True(t, utf8.ValidString(err.Error()))
	})
}

func TestDecodeExit(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]ExitStatus{
		`{"code":0,"status":"completed"}`:  {Code: 0},
		`{"code":3,"status":"failed"}`:     {Code: 3},
		`{"code":143,"status":"killed"}`:   {Code: -1, Signal: "SIGTERM"},
		`{"code":130,"status":"killed"}`:   {Code: -1, Signal: "SIGINT"},
		`{"code":137,"status":"killed"}`:   {Code: -1, Signal: "SIGKILL"},
		`{"status":"killed"}`:              {Code: -1, Signal: "SIGKILL"},
		`{"code":1,"status":"killed"}`:     {Code: -1, Signal: "SIGKILL"},
		`{"code":0,"status":"completed"} `: {Code: 0},
	} {
		got, err := cfDecodeExit(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{`{"status":"completed"}`, `{"code":0,"status":"running"}`, `{`, `[]`} {
		_, err := cfDecodeExit(bad)
		require.Error(t, err, bad)
	}
}

func TestStatusErrorMapping(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]error{
		400: ErrInvalid, 401: ErrInvalid, 403: ErrInvalid, 404: ErrNotFound, 409: ErrInvalid, 413: ErrInvalid,
		408: ErrUnavailable, 429: ErrUnavailable, 500: ErrUnavailable, 502: ErrUnavailable, 503: ErrUnavailable,
	} {
		err := cfStatusError(status, []byte(`{"error":"msg","code":"some_code"}`))
		require.ErrorIs(t, err, want, "%d", status)
		require.Contains(t, err.Error(), "some_code")
	}
	var he *cfHTTPError
	require.ErrorAs(t, cfStatusError(400, []byte(`{"error":{"code":"spawn_failed","message":"nope"}}`)), &he)
	require.Equal(t, "spawn_failed", he.Code)
	require.Equal(t, "nope", he.Message)
	require.ErrorIs(t, cfStatusError(502, []byte("<html>bad gateway</html>")), ErrUnavailable)
	require.Contains(t, cfStatusError(http.StatusUnauthorized, nil).Error(), "bearer token")
}

func TestCFPipeBounded(t *testing.T) {
	t.Parallel()
	p := newCFPipe(4)
	wrote := make(chan error, 1)
	go func() {
		_, err := p.Write([]byte("abcdefgh"))
		wrote <- err
	}()
	buf := make([]byte, 3)
	n, err := p.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "abc", string(buf[:n]))
	var got []byte
	for len(got) < 5 {
		n, err := p.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
	}
	require.Equal(t, "defgh", string(got))
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(guardInternal):
		t.Fatal("Write did not finish once the reader took the bytes")
	}
	_, _ = p.Write([]byte("z"))
	p.CloseWrite(io.EOF)
	b, err := io.ReadAll(p)
	require.NoError(t, err)
	require.Equal(t, "z", string(b))
}

func TestCFPipeCloseReadUnblocksWriter(t *testing.T) {
	t.Parallel()
	p := newCFPipe(2)
	wrote := make(chan error, 1)
	go func() {
		_, err := p.Write([]byte("more than two"))
		wrote <- err
	}()
	p.CloseRead(ErrClosed)
	select {
	case err := <-wrote:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(guardInternal):
		t.Fatal("Write still blocked after CloseRead")
	}
	_, err := p.Read(make([]byte, 1))
	require.ErrorIs(t, err, ErrClosed)
}

func TestCFPipeCloseWriteError(t *testing.T) {
	t.Parallel()
	p := newCFPipe(16)
	_, err := p.Write([]byte("partial"))
	require.NoError(t, err)
	boom := errors.New("boom")
	p.CloseWrite(boom)
	b, err := io.ReadAll(p)
	require.ErrorIs(t, err, boom)
	require.Equal(t, "partial", string(b))
}

func TestCheckPath(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "a/b", "./a", "a/./b", ".fleet/stdin-x", "a..b", "..a"} {
		require.NoError(t, cfCheckPath(ok), ok)
	}
	for _, bad := range []string{"", "/a", "..", "../a", "a/../../b", "a/..", "a\x00b", `a\b`} {
		require.ErrorIs(t, cfCheckPath(bad), ErrInvalid, bad)
	}
}

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for n, full := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		full *= time.Millisecond
		d := b.delay(n)
		require.GreaterOrEqual(t, d, full/2, "retry %d", n)
		require.LessOrEqual(t, d, full, "retry %d", n)
	}
}

// guardInternal bounds waits in this file's tests.
const guardInternal = time.Minute
