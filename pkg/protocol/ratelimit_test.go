package protocol

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// mayReportRateLimitQuotes is the previous MayReportRateLimit, which hopped
// from quote to quote after a search for "rate_limit": the reference the
// underscore hopping must agree with, and the benchmark's baseline.
func mayReportRateLimitQuotes(line []byte) bool {
	if len(line) > MaxRateLimitLine {
		return false
	}
	if bytes.Contains(line, []byte("rate_limit")) {
		return true
	}
	const key = `"api_error_status"`
	for rest := line; len(rest) >= len(key); {
		q := bytes.IndexByte(rest, '"')
		if q < 0 || len(rest)-q < len(key) {
			return false
		}
		rest = rest[q:]
		if rest[4] == '_' && rest[10] == '_' && bytes.EqualFold(rest[:len(key)], []byte(key)) {
			v := bytes.TrimLeft(rest[len(key):], " \t\r\n:")
			if len(v) > 0 && v[0] != 'n' {
				return true
			}
		}
		rest = rest[1:]
	}
	return false
}

func TestMayReportRateLimitEdges(t *testing.T) {
	for _, c := range []struct {
		line string
		want bool
	}{
		{`_rate_limit`, true},
		{`rate_limit`, true},
		{`rate_limi`, false},
		{`"API_ERROR_STATUS":429`, true},
		{`"Api_Error_Status" : "x"`, true},
		{`"api_error_status"`, false},
		{`"api_error_status":`, false},
		{`"api_error_status": null`, false},
		{`x"api_error_status"1`, true},
		{`"api_error_statuS"1`, true},
		{`"api-error_status"1`, false},
		{`"api_error-status"1`, false},
		{`___`, false},
		{``, false},
	} {
		require.Equal(t, c.want, MayReportRateLimit([]byte(c.line)), "%q", c.line)
		require.Equal(t, c.want, mayReportRateLimitQuotes([]byte(c.line)), "reference, %q", c.line)
	}
}

// FuzzMayReportRateLimit: the underscore hopping answers exactly as the
// quote hopping did, on any bytes.
func FuzzMayReportRateLimit(f *testing.F) {
	lines, _ := fixtureLines(f)
	for _, l := range lines[:min(len(lines), 50)] {
		f.Add(l)
	}
	f.Add([]byte(`{"type":"result","API_Error_Status":null,"api_error_status":4.29e2}`))
	f.Add([]byte(`{"type":"assistant","error":"rate_limit"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		require.Equal(t, mayReportRateLimitQuotes(line), MayReportRateLimit(line), "%q", line)
	})
}

// BenchmarkMayReportRateLimit runs the prefilter over the captured
// transcripts' lines beside the previous quote-hopping version.
func BenchmarkMayReportRateLimit(b *testing.B) {
	lines, size := fixtureLines(b)
	for _, c := range []struct {
		name string
		fn   func([]byte) bool
	}{{"underscores", MayReportRateLimit}, {"baseline_quotes", mayReportRateLimitQuotes}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				for _, l := range lines {
					_ = c.fn(l)
				}
			}
		})
	}
}
