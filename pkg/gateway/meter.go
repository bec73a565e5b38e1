package gateway

import (
	"bytes"
	"encoding/json"
)

// Usage is one call's token counts as the upstream reported them.
type Usage struct {
	InputTokens              int64
	OutputTokens             int64
	CacheReadInputTokens     int64
	CacheCreationInputTokens int64
	// CacheCreation1h is the part of CacheCreationInputTokens written with
	// a one-hour lifetime (priced higher).
	CacheCreation1h int64
}

// wireUsage is the usage object of message_start, message_delta and a
// non-streaming message. Pointers tell a field that is absent from one
// that is 0: message_delta's fields are cumulative and win when present.
type wireUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheCreation            *struct {
		Ephemeral1h *int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

// apply takes every field w has (the metering rule: per field, the last
// value reported, never a sum).
func (u *Usage) apply(w *wireUsage) {
	if w == nil {
		return
	}
	set := func(dst *int64, src *int64) {
		if src != nil && *src >= 0 {
			*dst = *src
		}
	}
	set(&u.InputTokens, w.InputTokens)
	set(&u.OutputTokens, w.OutputTokens)
	set(&u.CacheReadInputTokens, w.CacheReadInputTokens)
	set(&u.CacheCreationInputTokens, w.CacheCreationInputTokens)
	if w.CacheCreation != nil {
		set(&u.CacheCreation1h, w.CacheCreation.Ephemeral1h)
	}
}

// maxEventBytes bounds the data of one SSE event the decoder keeps; the
// events it reads (message_start, message_delta, error) are small, and a
// larger one is skipped rather than buffered.
const maxEventBytes = 1 << 20

// sseMeter reads the usage out of a Messages API event stream as it passes,
// chunk by chunk, without holding the stream: only the data lines of
// message_start, message_delta and error events (or events with no name)
// are kept, each up to maxEventBytes.
type sseMeter struct {
	usage Usage
	model string
	// seen is true once a message_start or message_delta was decoded.
	seen bool
	// errType is the type of an error event the stream carried, if any.
	errType string

	line    []byte // the current line so far, when it is kept
	keep    bool   // the current line is being kept
	atStart bool   // no byte of the current line seen yet
	skipLF  bool   // the last line ended in \r: a following \n ends nothing
	event   []byte // the current event's name
	data    []byte // the current event's data lines, joined by \n
	over    bool   // the current event's data went past maxEventBytes
}

func newSSEMeter() *sseMeter { return &sseMeter{atStart: true} }

// Write feeds the next bytes of the stream. It never fails.
func (m *sseMeter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if m.skipLF {
			m.skipLF = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		if m.atStart {
			m.atStart = false
			m.keep = true
			m.line = m.line[:0]
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			m.take(p)
			return n, nil
		}
		m.take(p[:i])
		m.skipLF = p[i] == '\r'
		p = p[i+1:]
		m.endLine()
		m.atStart = true
	}
	return n, nil
}

// take adds bytes to the current line while it may still matter: a line
// is kept while it is (a prefix of) an "event:" line, or a "data:" line of
// an event the meter reads, and only up to maxEventBytes.
func (m *sseMeter) take(b []byte) {
	if !m.keep {
		return
	}
	// Decide on the line's first six bytes before keeping any more.
	if n := len(m.line); n < 6 {
		head := b[:min(len(b), 6-n)]
		m.line = append(m.line, head...)
		b = b[len(head):]
		switch {
		case isField(m.line, "event:"):
		case isField(m.line, "data:"):
			m.keep = m.wanted()
		default:
			m.keep = false
		}
		if !m.keep {
			return
		}
	}
	if len(m.line)+len(b) > maxEventBytes {
		m.keep, m.line, m.over = false, m.line[:0], true
		return
	}
	m.line = append(m.line, b...)
}

// isField reports whether line starts with field, or could still.
func isField(line []byte, field string) bool {
	if len(line) >= len(field) {
		return string(line[:len(field)]) == field
	}
	return field[:len(line)] == string(line)
}

// wanted reports whether the current event's data should be kept.
func (m *sseMeter) wanted() bool {
	switch string(m.event) {
	case "", "message_start", "message_delta", "error":
		return true
	}
	return false
}

func (m *sseMeter) endLine() {
	line := m.line
	kept := m.keep
	m.line, m.keep = m.line[:0], false
	if len(line) == 0 && kept {
		m.dispatch()
		return
	}
	if !kept {
		return
	}
	switch {
	case bytes.HasPrefix(line, []byte("event:")):
		m.event = append(m.event[:0], trimSpace1(line[6:])...)
	case bytes.HasPrefix(line, []byte("data:")):
		if len(m.data) > 0 {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, trimSpace1(line[5:])...)
		if len(m.data) > maxEventBytes {
			m.data, m.over = m.data[:0], true
		}
	}
}

// trimSpace1 drops the one space SSE allows after the colon.
func trimSpace1(b []byte) []byte {
	if len(b) > 0 && b[0] == ' ' {
		return b[1:]
	}
	return b
}

// dispatch decodes the event that a blank line ended.
func (m *sseMeter) dispatch() {
	defer func() { m.event, m.data, m.over = m.event[:0], m.data[:0], false }()
	if m.over || len(m.data) == 0 || !m.wanted() {
		return
	}
	var ev struct {
		Type    string `json:"type"`
		Message *struct {
			Model string     `json:"model"`
			Usage *wireUsage `json:"usage"`
		} `json:"message"`
		Usage *wireUsage `json:"usage"`
		Error *struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(m.data, &ev) != nil {
		return
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil {
			m.seen = true
			m.model = ev.Message.Model
			m.usage.apply(ev.Message.Usage)
		}
	case "message_delta":
		m.seen = true
		m.usage.apply(ev.Usage)
	case "error":
		if ev.Error != nil {
			m.errType = ev.Error.Type
		}
	}
}

// maxJSONBytes bounds how much of a non-streaming answer is kept to read
// its usage (a message, not a stream; the upstream's own limits are far
// below this).
const maxJSONBytes = 16 << 20

// jsonMeter keeps a non-streaming answer's body (up to maxJSONBytes) to
// read its model and usage once it has passed.
type jsonMeter struct {
	buf  []byte
	over bool
}

// Write keeps p. It never fails.
func (m *jsonMeter) Write(p []byte) (int, error) {
	if !m.over && len(m.buf)+len(p) <= maxJSONBytes {
		m.buf = append(m.buf, p...)
	} else {
		m.over, m.buf = true, nil
	}
	return len(p), nil
}

// decode returns the message's model and usage; ok is false when the body
// is not a JSON object with a usage.
func (m *jsonMeter) decode() (model string, u Usage, ok bool) {
	return decodeMessage(m.buf)
}

// decodeMessage reads the model and usage of a non-streaming Messages API
// answer.
func decodeMessage(b []byte) (model string, u Usage, ok bool) {
	var msg struct {
		Model string     `json:"model"`
		Usage *wireUsage `json:"usage"`
	}
	if json.Unmarshal(b, &msg) != nil || msg.Usage == nil {
		return "", Usage{}, false
	}
	u.apply(msg.Usage)
	return msg.Model, u, true
}

// sniffModel reads the "model" of a request body from its first bytes
// (Claude Code sends it first; a body cut short or without it gives "").
// It walks the top-level object's keys and stops at "model".
func sniffModel(prefix []byte) string {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := k.(string)
		if key == "model" {
			var s string
			if dec.Decode(&s) != nil {
				return ""
			}
			return s
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
