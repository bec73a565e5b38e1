package sandbox

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// This file decodes the bridge's exec stream (deploy/cloudflare/README.md): a
// text/event-stream whose events are
//
//	event: out   data: {"fd":1|2,"off":<bytes of that fd before this chunk>,"b64":"…"}
//	event: exit  data: {"code":N,"status":"completed|failed|killed"}
//	event: error data: {"code":"…","message":"…"}
//
// plus ": ping" comment lines. The parser follows the WHATWG
// server-sent-events rules (LF, CR and CRLF line ends, one optional space
// after the colon, multi-line data joined with "\n", comments skipped, an
// unterminated event at end of input dropped) and bounds every event's size,
// since its input comes from the network.

// errSSETooLarge is returned when one line or one event's data exceeds the
// parser's limit.
var errSSETooLarge = errors.New("sse: event too large")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	// Event is the event: field ("" when the frame had none).
	Event string
	// Data is the data: lines joined with "\n".
	Data string
	// ID is the last id: field seen (it persists across events, per spec).
	ID string
}

// sseReader reads events from a text/event-stream body.
type sseReader struct {
	r      *bufio.Reader
	max    int
	line   []byte
	data   []byte
	skipLF bool
	lastID string
}

// newSSEReader returns a reader that refuses lines or events larger than
// maxEvent bytes (at least 1 KiB is used).
func newSSEReader(r io.Reader, maxEvent int) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 64<<10), max: max(maxEvent, 1<<10)}
}

// readLine returns the next line without its terminator (LF, CR or CRLF).
// The returned slice is only valid until the next call.
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		if s.skipLF {
			s.skipLF = false
			if b, err := s.r.Peek(1); err == nil && b[0] == '\n' {
				_, _ = s.r.Discard(1)
			}
		}
		buf, err := s.r.Peek(max(1, s.r.Buffered()))
		if len(buf) == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			if errors.Is(err, io.EOF) && len(s.line) > 0 {
				// An unterminated line can only belong to an event that is
				// never dispatched: the input ended mid-event.
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if i := bytes.IndexAny(buf, "\r\n"); i >= 0 {
			if len(s.line)+i > s.max {
				return nil, errSSETooLarge
			}
			s.line = append(s.line, buf[:i]...)
			s.skipLF = buf[i] == '\r'
			_, _ = s.r.Discard(i + 1)
			return s.line, nil
		}
		if len(s.line)+len(buf) > s.max {
			return nil, errSSETooLarge
		}
		s.line = append(s.line, buf...)
		_, _ = s.r.Discard(len(buf))
	}
}

// Next returns the next event. It returns io.EOF when the input ends cleanly
// between events and io.ErrUnexpectedEOF when it ends inside one; any other
// error is the underlying reader's or errSSETooLarge.
func (s *sseReader) Next() (sseEvent, error) {
	var ev sseEvent
	s.data = s.data[:0]
	hasData := false
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && (hasData || ev.Event != "") {
				err = io.ErrUnexpectedEOF
			}
			return sseEvent{}, err
		}
		if len(line) == 0 {
			if !hasData {
				// Per spec: no data, no dispatch; reset the event name.
				ev.Event = ""
				continue
			}
			ev.Data = string(bytes.TrimSuffix(s.data, []byte{'\n'}))
			ev.ID = s.lastID
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment, e.g. ": ping"
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte{' '})
		}
		switch string(field) {
		case "event":
			ev.Event = string(value)
		case "data":
			if len(s.data)+len(value)+1 > s.max {
				return sseEvent{}, errSSETooLarge
			}
			s.data = append(s.data, value...)
			s.data = append(s.data, '\n')
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				s.lastID = string(value)
			}
		default:
			// "retry" and unknown fields are ignored.
		}
	}
}

// Stream event names (deploy/cloudflare/README.md).
const (
	sseOut   = "out"
	sseExit  = "exit"
	sseError = "error"
)

// cfOutEvent is the data of an "out" event.
type cfOutEvent struct {
	FD  int    `json:"fd"`
	Off int64  `json:"off"`
	B64 string `json:"b64"`
}

// cfExitEvent is the data of an "exit" event.
type cfExitEvent struct {
	Code   *int   `json:"code"`
	Status string `json:"status"`
}

// cfErrorEvent is the data of an "error" event.
type cfErrorEvent struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// cfOutChunk is a decoded "out" event.
type cfOutChunk struct {
	fd   int
	off  int64
	data []byte
}

// cfDecodeOut decodes and checks an "out" event's data.
func cfDecodeOut(data string) (cfOutChunk, error) {
	var ev cfOutEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		return cfOutChunk{}, fmt.Errorf("decode out event: %w", err)
	}
	if ev.FD != 1 && ev.FD != 2 {
		return cfOutChunk{}, fmt.Errorf("decode out event: fd %d is not 1 or 2", ev.FD)
	}
	if ev.Off < 0 {
		return cfOutChunk{}, fmt.Errorf("decode out event: negative offset %d", ev.Off)
	}
	b, err := base64.StdEncoding.DecodeString(ev.B64)
	if err != nil {
		return cfOutChunk{}, fmt.Errorf("decode out event: b64: %w", err)
	}
	return cfOutChunk{fd: ev.FD, off: ev.Off, data: b}, nil
}

// cfDecodeExit decodes an "exit" event's data into an ExitStatus (without the
// stderr tail). Status "killed" gives Code -1 and a Signal: the bridge reports
// a signalled process's code as 128+signal number, as a shell does, and any
// other code is read as SIGKILL (the bridge's kill escalates to it).
func cfDecodeExit(data string) (ExitStatus, error) {
	var ev cfExitEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		return ExitStatus{}, fmt.Errorf("decode exit event: %w", err)
	}
	code := -1
	if ev.Code != nil {
		code = *ev.Code
	}
	switch ev.Status {
	case "killed":
		return ExitStatus{Code: -1, Signal: cfSignalFromCode(code)}, nil
	case "completed", "failed":
		if ev.Code == nil {
			return ExitStatus{}, fmt.Errorf("decode exit event: status %q without code", ev.Status)
		}
		return ExitStatus{Code: code}, nil
	default:
		return ExitStatus{}, fmt.Errorf("decode exit event: unknown status %q", cfClip(ev.Status, 40))
	}
}

// cfDecodeError decodes an "error" event's data into an error.
func cfDecodeError(data string) error {
	var ev cfErrorEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		return fmt.Errorf("bridge error event (undecodable): %w", err)
	}
	return fmt.Errorf("bridge error event: %s: %s", cfClip(ev.Code, 64), cfClip(ev.Message, 300))
}

// cfSignalNames maps the signal numbers a bridge may report (code-128) to names.
var cfSignalNames = map[int]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL",
	13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
}

// cfSignalFromCode names the signal behind a shell-style exit code (128+n),
// defaulting to SIGKILL.
func cfSignalFromCode(code int) string {
	if name, ok := cfSignalNames[code-128]; ok {
		return name
	}
	return "SIGKILL"
}

// clip shortens s to at most n bytes for use in error messages, keeping it
// valid UTF-8 and single-line.
func cfClip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
