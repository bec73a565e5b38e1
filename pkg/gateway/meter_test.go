package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stream is a Messages API stream as the API sends it: usage in
// message_start, cumulative usage in message_delta, pings between.
const stream = "event: message_start\n" +
	`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-5-5-20261101","content":[],"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":200},"output_tokens":1}}}` + "\n\n" +
	"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage: {\\\"output_tokens\\\": 999}\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}` + "\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","delta":{},"usage":{"input_tokens":12,"cache_read_input_tokens":4000,"output_tokens":42}}` + "\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

var streamUsage = Usage{InputTokens: 12, OutputTokens: 42, CacheReadInputTokens: 4000, CacheCreationInputTokens: 300, CacheCreation1h: 200}

func meterAll(chunks ...string) *sseMeter {
	m := newSSEMeter()
	for _, c := range chunks {
		_, _ = m.Write([]byte(c))
	}
	return m
}

func TestSSEMeterTakesTheLastValueOfEachField(t *testing.T) {
	t.Parallel()
	m := meterAll(stream)
	require.True(t, m.seen)
	require.Equal(t, "claude-opus-5-5-20261101", m.model)
	require.Equal(t, streamUsage, m.usage)
}

func TestSSEMeterReadsAStreamCutAnywhere(t *testing.T) {
	t.Parallel()
	for _, s := range []string{stream, strings.ReplaceAll(stream, "\n", "\r\n"), strings.ReplaceAll(stream, "\n", "\r"),
		strings.ReplaceAll(stream, "data: ", "data:")} {
		for i := range len(s) {
			m := meterAll(s[:i], s[i:])
			require.Equal(t, streamUsage, m.usage, "cut at %d", i)
		}
		bytewise := newSSEMeter()
		for i := range len(s) {
			_, _ = bytewise.Write([]byte{s[i]})
		}
		require.Equal(t, streamUsage, bytewise.usage)
	}
}

func TestSSEMeterSkipsWhatItDoesNotRead(t *testing.T) {
	t.Parallel()
	big := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"" + strings.Repeat("x", 3<<20) + "\"}}\n\n"
	m := meterAll(big, stream)
	require.Equal(t, streamUsage, m.usage)
	require.Less(t, cap(m.line)+cap(m.data), 64<<10, "the meter held a delta it does not read")

	// An event over the limit is dropped, the stream after it still read.
	huge := "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7},\"pad\":\"" + strings.Repeat("p", maxEventBytes) + "\"}\n\n"
	m = meterAll(stream, huge)
	require.Equal(t, streamUsage, m.usage)

	// An error event after a 200.
	m = meterAll(stream[:300], "\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	require.Equal(t, "overloaded_error", m.errType)

	// Events with no name are read by their type.
	m = meterAll("data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3,\"input_tokens\":-5}}\n\n")
	require.Equal(t, Usage{OutputTokens: 3}, m.usage, "a negative count is ignored")
}

func TestDecodeMessage(t *testing.T) {
	t.Parallel()
	model, u, ok := decodeMessage([]byte(`{"id":"m","type":"message","model":"claude-haiku-5-5","content":[],"usage":{"input_tokens":5,"output_tokens":6,"cache_read_input_tokens":7,"cache_creation_input_tokens":8}}`))
	require.True(t, ok)
	require.Equal(t, "claude-haiku-5-5", model)
	require.Equal(t, Usage{InputTokens: 5, OutputTokens: 6, CacheReadInputTokens: 7, CacheCreationInputTokens: 8}, u)
	for _, bad := range []string{``, `null`, `[]`, `{"usage":null}`, `{"type":"error"}`, `{"usage":{"input_tokens":"x"}}`} {
		_, _, ok := decodeMessage([]byte(bad))
		require.False(t, ok, bad)
	}
}

func TestSniffModel(t *testing.T) {
	t.Parallel()
	require.Equal(t, "claude-opus-5-5", sniffModel([]byte(`{"model":"claude-opus-5-5","messages":[`)))
	require.Equal(t, "m2", sniffModel([]byte(`{"max_tokens":5,"system":[{"a":"}"}],"model":"m2"}`)))
	for _, bad := range []string{``, `[]`, `{"messages":[{"role":"user"`, `{"model":5}`, `{"model":"unterminated`} {
		require.Empty(t, sniffModel([]byte(bad)), bad)
	}
}

func TestRetryUntil(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	require.Equal(t, now.Add(1500*time.Millisecond), retryUntil(h("Retry-After-Ms", "1500", "Retry-After", "9"), now))
	require.Equal(t, now.Add(9*time.Second), retryUntil(h("Retry-After", "9"), now))
	require.Equal(t, now.Add(time.Hour), retryUntil(h("Retry-After", now.Add(time.Hour).Format(http.TimeFormat)), now))
	require.Equal(t, now.Add(2*time.Minute), retryUntil(h(
		"Anthropic-Ratelimit-Requests-Reset", now.Add(time.Minute).Format(time.RFC3339),
		"Anthropic-Ratelimit-Output-Tokens-Reset", now.Add(2*time.Minute).Format(time.RFC3339),
		"Anthropic-Ratelimit-Tokens-Remaining", "0"), now))
	require.True(t, retryUntil(h("Retry-After", "soon", "Retry-After-Ms", "-1"), now).IsZero())
	require.True(t, retryUntil(h("Retry-After", "1e300"), now).IsZero())
}

func FuzzSSEMeter(f *testing.F) {
	f.Add([]byte(stream), uint16(17))
	f.Add([]byte(strings.ReplaceAll(stream, "\n", "\r\n")), uint16(1))
	f.Add([]byte("data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\r\r"), uint16(3))
	f.Add([]byte("event:\ndata\n\n:\n\r\n"), uint16(2))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		whole := meterAll(string(b))
		i := int(cut) % (len(b) + 1)
		split := meterAll(string(b[:i]), string(b[i:]))
		// However the stream is cut into chunks, the meter reads the same.
		require.Equal(t, whole.usage, split.usage)
		require.Equal(t, whole.model, split.model)
		require.Equal(t, whole.errType, split.errType)
		for _, v := range []int64{whole.usage.InputTokens, whole.usage.OutputTokens, whole.usage.CacheReadInputTokens, whole.usage.CacheCreationInputTokens} {
			require.GreaterOrEqual(t, v, int64(0))
		}
	})
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"model":"claude-haiku-5-5","usage":{"input_tokens":5,"output_tokens":6}}`))
	f.Add([]byte(`{"usage":{"cache_creation":{"ephemeral_1h_input_tokens":3}}}`))
	f.Add([]byte(`{"usage":{"input_tokens":1e30}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, u, ok := decodeMessage(b)
		if !ok {
			require.Equal(t, Usage{}, u)
		}
		cost := DefaultPrices()["claude-haiku-5-5"].Cost(u)
		require.GreaterOrEqual(t, cost, 0.0)
	})
}

func FuzzSniffModel(f *testing.F) {
	f.Add([]byte(`{"model":"claude-opus-5-5","messages":[]}`))
	f.Add([]byte(`{"a":{"model":"no"},"model":"yes"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = sniffModel(b)
	})
}

func FuzzRetryUntil(f *testing.F) {
	f.Add("7", "", "2026-11-26T12:00:00Z")
	f.Add("", "250", "garbage")
	f.Fuzz(func(t *testing.T, after, afterMS, reset string) {
		h := http.Header{}
		h.Set("Retry-After", after)
		h.Set("Retry-After-Ms", afterMS)
		h.Set("Anthropic-Ratelimit-Requests-Reset", reset)
		_ = retryUntil(h, time.Now())
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"call":3,"attempt":1,"model":"m","input_tokens":1,"output_tokens":2,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"cost_usd":0.1,"status":200,"ms":5}`))
	f.Add([]byte(`{"call":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeEvent(b)
		if err == nil {
			require.GreaterOrEqual(t, ev.Call, 0)
		}
	})
}
