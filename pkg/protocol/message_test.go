package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// oracleHeader computes what ParseMessage must return for line, using
// encoding/json on the whole object (exact keys, last duplicate wins).
func oracleHeader(line []byte) Message {
	want := Message{Raw: line}
	trimmed := bytes.TrimLeft(line, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(line) {
		return want
	}
	want.JSON = true
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		panic(err)
	}
	str := func(key string) (string, bool) {
		var s string
		raw, ok := obj[key]
		if !ok || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	}
	want.Type, _ = str("type")
	want.Subtype, _ = str("subtype")
	want.UUID, _ = str("uuid")
	want.SessionID, _ = str("session_id")
	if p, ok := str("parent_tool_use_id"); ok {
		want.ParentToolUseID = &p
	}
	return want
}

func TestParseMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want Message // Raw is filled in by the test
	}{
		{name: "assistant main thread",
			line: `{"type":"assistant","message":{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}]},"parent_tool_use_id":null,"session_id":"s1","uuid":"u1"}`,
			want: Message{JSON: true, Type: "assistant", SessionID: "s1", UUID: "u1"}},
		{name: "subagent frame",
			line: `{"type":"user","message":{"role":"user"},"parent_tool_use_id":"toolu_01","session_id":"s1","uuid":"u2"}`,
			want: Message{JSON: true, Type: "user", SessionID: "s1", UUID: "u2", ParentToolUseID: ptr("toolu_01")}},
		{name: "type not first key",
			line: `{"duration_api_ms":10,"is_error":false,"result":"ok","type":"result","subtype":"success","uuid":"u3"}`,
			want: Message{JSON: true, Type: "result", Subtype: "success", UUID: "u3"}},
		{name: "unknown type and fields",
			line: `{"type":"brand_new_event","payload":{"deep":[1,2,{"type":"x"}]},"weird":1e400}`,
			want: Message{JSON: true, Type: "brand_new_event"}},
		{name: "unknown system subtype",
			line: `{"type":"system","subtype":"quantum_flux","session_id":"s"}`,
			want: Message{JSON: true, Type: "system", Subtype: "quantum_flux", SessionID: "s"}},
		{name: "nested type ignored",
			line: `{"message":{"type":"message"},"event":{"type":"content_block_delta"}}`,
			want: Message{JSON: true}},
		{name: "escaped key", line: `{"\u0074ype":"user"}`, want: Message{JSON: true, Type: "user"}},
		{name: "escaped value", line: `{"type":"ass\u0069stant","uuid":"a\"b"}`, want: Message{JSON: true, Type: "assistant", UUID: `a"b`}},
		{name: "non-ASCII value", line: `{"type":"tÿpe","session_id":"sé"}`, want: Message{JSON: true, Type: "tÿpe", SessionID: "sé"}},
		{name: "strings with quotes and backslashes",
			line: `{"a":"x\"}","b":"y\\","c":"\\\"","type":"result","uuid":"u"}`,
			want: Message{JSON: true, Type: "result", UUID: "u"}},
		{name: "type not a string", line: `{"type":5,"subtype":null,"uuid":["x"]}`, want: Message{JSON: true}},
		{name: "duplicate key last wins", line: `{"type":"a","type":"b"}`, want: Message{JSON: true, Type: "b"}},
		{name: "whitespace", line: " \t{ \"type\" : \"user\" ,\n \"uuid\" : \"u\" } ", want: Message{JSON: true, Type: "user", UUID: "u"}},
		{name: "empty object", line: `{}`, want: Message{JSON: true}},
		{name: "empty strings", line: `{"type":"","uuid":"","parent_tool_use_id":""}`, want: Message{JSON: true, ParentToolUseID: ptr("")}},
		{name: "empty line", line: ``, want: Message{}},
		{name: "non-JSON", line: `[SandboxDebug] spawning bwrap`, want: Message{}},
		{name: "ANSI noise before JSON", line: "\x1b[?1004l{\"type\":\"user\"}", want: Message{}},
		{name: "JSON array", line: `[{"type":"user"}]`, want: Message{}},
		{name: "JSON string", line: `"type"`, want: Message{}},
		{name: "truncated object", line: `{"type":"user","uuid":"u`, want: Message{}},
		{name: "trailing garbage", line: `{"type":"user"} x`, want: Message{}},
		{name: "two objects", line: `{"type":"user"}{"type":"result"}`, want: Message{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			line := []byte(tt.line)
			got := ParseMessage(line)
			tt.want.Raw = line
			require.Equal(t, tt.want, got)
			require.Equal(t, oracleHeader(line), got)
			if len(line) > 0 {
				require.Same(t, &line[0], &got.Raw[0], "Raw must alias the line")
			}
			require.Equal(t, tt.want.Type == TypeResult, got.IsResult())
		})
	}
}

func TestAsResult(t *testing.T) {
	t.Parallel()

	t.Run("success", func(t *testing.T) {
		t.Parallel()
		m := ParseMessage([]byte(`{"type":"result","subtype":"success","is_error":false,"result":"done","num_turns":2,"duration_ms":5,"total_cost_usd":0.5,"session_id":"s","usage":{"input_tokens":1},"unknown":[1]}`))
		r, err := m.AsResult()
		require.NoError(t, err)
		require.True(t, r.Success())
		require.Equal(t, "done", *r.Result)
		require.Equal(t, 2, r.NumTurns)
		require.JSONEq(t, `{"input_tokens":1}`, string(r.Usage))
		require.Nil(t, r.XFleet)
	})
	t.Run("success subtype with is_error", func(t *testing.T) {
		t.Parallel()
		m := ParseMessage([]byte(`{"type":"result","subtype":"success","is_error":true,"api_error_status":404,"result":"API Error: 404","errors":[]}`))
		r, err := m.AsResult()
		require.NoError(t, err)
		require.False(t, r.Success(), "success is decided by is_error, not subtype")
	})
	t.Run("drift in an informational field is tolerated", func(t *testing.T) {
		t.Parallel()
		m := ParseMessage([]byte(`{"type":"result","num_turns":"31","errors":[{"x":1}],"is_error":true,"subtype":"error_max_turns"}`))
		r, err := m.AsResult()
		require.NoError(t, err)
		require.True(t, r.IsError)
		require.Equal(t, SubtypeErrorMaxTurns, r.Subtype)
	})
	t.Run("is_error of the wrong type fails", func(t *testing.T) {
		t.Parallel()
		_, err := ParseMessage([]byte(`{"type":"result","is_error":"yes"}`)).AsResult()
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrNotResult)
	})
	t.Run("not a result", func(t *testing.T) {
		t.Parallel()
		_, err := ParseMessage([]byte(`{"type":"assistant"}`)).AsResult()
		require.ErrorIs(t, err, ErrNotResult)
		_, err = ParseMessage([]byte(`not json`)).AsResult()
		require.ErrorIs(t, err, ErrNotResult)
	})
}

const fixtureDir = "testdata/claude-stream-json"

func fixtureFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.ndjson"))
	require.NoError(t, err)
	require.Len(t, files, 6)
	return files
}

// readAllLines reads every line of data through a LineReader, copying them.
func readAllLines(t testing.TB, r io.Reader, maxLine int) [][]byte {
	t.Helper()
	lr := NewLineReader(r, maxLine)
	var lines [][]byte
	for {
		line, err := lr.Next()
		if errors.Is(err, io.EOF) {
			return lines
		}
		require.NoError(t, err)
		lines = append(lines, bytes.Clone(line))
	}
}

func messageKey(m Message) string {
	if m.Type == TypeSystem || m.Type == TypeResult {
		return m.Type + "/" + m.Subtype
	}
	return m.Type
}

// TestFixtures reads every real capture through LineReader and ParseMessage:
// bytes survive unchanged, every line is classified, and the count of each
// type (and system/result subtype) matches testdata/fixture_types.json.
func TestFixtures(t *testing.T) {
	t.Parallel()
	counts := map[string]map[string]int{}
	for _, path := range fixtureFiles(t) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		lines := readAllLines(t, bytes.NewReader(data), 0)

		var rebuilt []byte
		for _, l := range lines {
			rebuilt = append(append(rebuilt, l...), '\n')
		}
		if !bytes.HasSuffix(data, []byte("\n")) {
			rebuilt = rebuilt[:len(rebuilt)-1]
		}
		require.Equal(t, data, rebuilt, "%s: lines must be byte-identical", path)

		c := map[string]int{}
		for i, l := range lines {
			m := ParseMessage(l)
			require.True(t, m.JSON, "%s line %d", path, i+1)
			require.NotEmpty(t, m.Type, "%s line %d", path, i+1)
			require.Equal(t, oracleHeader(l), m, "%s line %d", path, i+1)
			c[messageKey(m)]++
			if m.IsResult() {
				r, err := m.AsResult()
				require.NoError(t, err, "%s line %d", path, i+1)
				require.Equal(t, m.Subtype, r.Subtype)
				require.Equal(t, m.SessionID, r.SessionID)
			}
		}
		counts[filepath.Base(path)] = c
	}

	got, err := json.MarshalIndent(counts, "", "  ")
	require.NoError(t, err)
	got = append(got, '\n')
	golden := filepath.Join("testdata", "fixture_types.json")
	if *update {
		require.NoError(t, os.WriteFile(golden, got, 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run go test -update to create it")
	require.Equal(t, string(want), string(got))
}

func TestFixtureMaxTurnsResults(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(fixtureDir, "obscura-error-max-turns-results.ndjson"))
	require.NoError(t, err)
	lines := readAllLines(t, bytes.NewReader(data), 0)
	require.Len(t, lines, 4)
	for _, l := range lines {
		require.NotContains(t, string(l), `"result":`, "fixture has no result key")
		r, err := ParseMessage(l).AsResult()
		require.NoError(t, err)
		require.Nil(t, r.Result)
		require.True(t, r.IsError)
		require.False(t, r.Success())
		require.Equal(t, SubtypeErrorMaxTurns, r.Subtype)
		require.Equal(t, []string{"Reached maximum number of turns (30)"}, r.Errors)
		require.Equal(t, "max_turns", r.TerminalReason)
		require.Equal(t, 31, r.NumTurns)
		require.NotEmpty(t, r.Usage)
	}
}

func TestFixtureResultTypeNotFirst(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(fixtureDir, "mufu-myterminal-plain-text-2.1.265.ndjson"))
	require.NoError(t, err)
	lines := readAllLines(t, bytes.NewReader(data), 0)
	last := lines[len(lines)-1]
	require.False(t, bytes.HasPrefix(last, []byte(`{"type"`)))
	m := ParseMessage(last)
	require.Equal(t, TypeResult, m.Type)
	r, err := m.AsResult()
	require.NoError(t, err)
	require.True(t, r.Success())
	require.NotNil(t, r.Result)
}

func FuzzParseMessage(f *testing.F) {
	for _, path := range fixtureFiles(f) {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			if len(line) < 4096 {
				f.Add(line)
			}
		}
	}
	for _, s := range []string{``, `{}`, `{"type":"a","type":5}`, `{"\u0074ype":"x"}`, "{\"type\":\"\xff\"}", `{"a":"\\\"","type":"r"}`, `[`, `{"type":"user"} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		m := ParseMessage(line)
		require.Equal(t, oracleHeader(line), m)
		if m.IsResult() {
			_, _ = m.AsResult() // must not panic
		}
	})
}

// fixtureLines returns every line of every fixture.
func fixtureLines(b testing.TB) (lines [][]byte, size int) {
	for _, path := range fixtureFiles(b) {
		data, err := os.ReadFile(path)
		require.NoError(b, err)
		for _, l := range readAllLines(b, bytes.NewReader(data), 0) {
			lines = append(lines, l)
			size += len(l)
		}
	}
	return lines, size
}

func BenchmarkParseMessage(b *testing.B) {
	lines, size := fixtureLines(b)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		for _, l := range lines {
			_ = ParseMessage(l)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N*len(lines)), "allocs/line")
}

// BenchmarkParseMessageByType reports the cost of the common line kinds.
func BenchmarkParseMessageByType(b *testing.B) {
	lines, _ := fixtureLines(b)
	byType := map[string][]byte{}
	for _, l := range lines {
		m := ParseMessage(l)
		if _, seen := byType[m.Type]; !seen {
			byType[m.Type] = l
		}
	}
	types := make([]string, 0, len(byType))
	for typ := range byType {
		types = append(types, typ)
	}
	sort.Strings(types)
	for _, typ := range types {
		line := byType[typ]
		b.Run(strings.ReplaceAll(typ, "/", "_"), func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for b.Loop() {
				_ = ParseMessage(line)
			}
		})
	}
}

func TestParseMessageNestingLimit(t *testing.T) {
	t.Parallel()
	for _, depth := range []int{maxNestingDepth - 1, maxNestingDepth, maxNestingDepth + 1} {
		// depth containers in all: the top-level object plus depth-1 arrays/objects.
		inner := depth - 1
		var sb strings.Builder
		sb.WriteString(`{"type":"x","a":`)
		for i := range inner {
			if i%2 == 0 {
				sb.WriteString(`[`)
			} else {
				sb.WriteString(`{"k":`)
			}
		}
		sb.WriteString(`1`)
		for i := inner - 1; i >= 0; i-- {
			if i%2 == 0 {
				sb.WriteString(`]`)
			} else {
				sb.WriteString(`}`)
			}
		}
		sb.WriteString(`}`)
		line := []byte(sb.String())
		require.Equal(t, json.Valid(line), ParseMessage(line).JSON, "depth %d", depth)
		require.Equal(t, depth <= maxNestingDepth, ParseMessage(line).JSON, "depth %d", depth)
	}
}

func TestScanMatchesJSONValid(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		`{"a":-0}`, `{"a":-}`, `{"a":01}`, `{"a":1.}`, `{"a":1.5e}`, `{"a":1.5e+3}`, `{"a":1E-3}`, `{"a":.5}`,
		`{"a":tru}`, `{"a":true}`, `{"a":nul}`, `{"a":falsey}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"a":{"b":1,}}`,
		`{"a":{"b"}}`, `{"a":{1:2}}`, `{"a":"\u12"}`, `{"a":"\u12g4"}`, `{"a":"\x"}`, "{\"a\":\"\t\"}", "{\"a\":\"\x7f\xff\"}",
		`{"a":[[]]}`, `{"a":[{}]}`, `{"a":{"b":[]}}`, `{"a" 1}`, `{"a":1 "b":2}`, `{"a":1}}`, `{"a":[1]]}`, `{,}`,
		"{\"a\":1}\x00", "\x00{}", `{"a":"\/\b\f\n\r\t\"\\"}`, `{"":""}`, `{"a":[1 2]}`, `{"a":[1,{"b":[null,true,false]}]}`,
	} {
		require.Equal(t, json.Valid([]byte(s)), ParseMessage([]byte(s)).JSON, "%q", s)
	}
}

func TestHasSpecial(t *testing.T) {
	t.Parallel()
	for pos := range 8 {
		for c := range 256 {
			var b [8]byte
			for i := range b {
				b[i] = 'a'
			}
			b[pos] = byte(c)
			want := c < 0x20 || c == '"' || c == '\\'
			require.Equal(t, want, hasSpecial(binary.LittleEndian.Uint64(b[:])), "byte %#x at %d", c, pos)
		}
	}
	// Bytes above 0x80 around a special byte must not hide it.
	require.True(t, hasSpecial(binary.LittleEndian.Uint64([]byte{0xff, 0x80, '"', 0xfe, 0x81, 0x90, 0xa0, 0xc3})))
	require.False(t, hasSpecial(binary.LittleEndian.Uint64([]byte{0xff, 0x80, 0xa0, 0xfe, 0x81, 0x90, 0x20, 0x7f})))
}
