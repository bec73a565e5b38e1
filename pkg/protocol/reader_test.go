package protocol

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func marker(n, limit int) string {
	return `{"type":"x_fleet_line_too_large","bytes":` + strconv.Itoa(n) + `,"cap":` + strconv.Itoa(limit) + `}`
}

// refLines is the reference model of LineReader: split on \n, trim one \r
// before each \n, keep a final unterminated line as is, replace lines over
// maxLine by a marker.
func refLines(data []byte, maxLine int) (lines []string, oversized int) {
	for len(data) > 0 {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = bytes.TrimSuffix(data[:i], []byte("\r")), data[i+1:]
		} else {
			line, data = data, nil
		}
		if len(line) > maxLine {
			lines = append(lines, marker(len(line), maxLine))
			oversized++
			continue
		}
		lines = append(lines, string(line))
	}
	return lines, oversized
}

// collect reads every line of lr, checking that io.EOF (or the reader's
// error) is sticky.
func collect(t testing.TB, lr *LineReader) ([]string, error) {
	t.Helper()
	var lines []string
	for {
		line, err := lr.Next()
		if err != nil {
			require.Nil(t, line)
			again, err2 := lr.Next()
			require.Nil(t, again)
			require.Equal(t, err, err2, "the final error must be sticky")
			return lines, err
		}
		lines = append(lines, string(line))
	}
}

var readBufSizes = []int{16, 17, readBufSize}

func TestLineReader(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 40)
	tests := []struct {
		name    string
		input   string
		maxLine int
		want    []string
	}{
		{name: "empty input", input: "", want: nil},
		{name: "lines", input: "a\nbb\n", want: []string{"a", "bb"}},
		{name: "CRLF", input: "a\r\nbb\r\n", want: []string{"a", "bb"}},
		{name: "mixed terminators", input: "a\r\nb\nc\r\n", want: []string{"a", "b", "c"}},
		{name: "missing final newline", input: "a\nlast", want: []string{"a", "last"}},
		{name: "final CR kept on incomplete line", input: "a\r\nb\r", want: []string{"a", "b\r"}},
		{name: "only one CR trimmed", input: "a\r\r\n", want: []string{"a\r"}},
		{name: "lone CR is not a terminator", input: "a\rb\n", want: []string{"a\rb"}},
		{name: "empty lines", input: "\n\r\n\na\n\n", want: []string{"", "", "", "a", ""}},
		{name: "non-JSON and ANSI noise passed through",
			input: "[SandboxDebug] x\n\x1b[?1004l{\"type\":\"user\"}\n\x1b[0m\n",
			want:  []string{"[SandboxDebug] x", "\x1b[?1004l{\"type\":\"user\"}", "\x1b[0m"}},
		{name: "unknown JSON passed through", input: `{"type":"brand_new","z":1}` + "\n", want: []string{`{"type":"brand_new","z":1}`}},
		{name: "line at cap", input: "abcd\n", maxLine: 4, want: []string{"abcd"}},
		{name: "line at cap with CRLF", input: "abcd\r\n", maxLine: 4, want: []string{"abcd"}},
		{name: "line over cap", input: "abcd\nabcde\nxy\n", maxLine: 4, want: []string{"abcd", marker(5, 4), "xy"}},
		{name: "line over cap with CRLF", input: "abcde\r\nxy", maxLine: 4, want: []string{marker(5, 4), "xy"}},
		{name: "over cap at EOF", input: "ab\nabcdefgh", maxLine: 4, want: []string{"ab", marker(8, 4)}},
		{name: "incomplete line with CR over cap", input: "abcd\r", maxLine: 4, want: []string{marker(5, 4)}},
		{name: "long line over cap", input: long + "\nok\n", maxLine: 20, want: []string{marker(40, 20), "ok"}},
		{name: "long line over cap CRLF split", input: strings.Repeat("y", 31) + "\r\n" + "ok\n", maxLine: 20, want: []string{marker(31, 20), "ok"}},
		{name: "long line under cap", input: long + "\r\n" + long, maxLine: 40, want: []string{long, long}},
		{name: "consecutive oversized", input: long + "\n" + long + "\n", maxLine: 20, want: []string{marker(40, 20), marker(40, 20)}},
	}
	for _, tt := range tests {
		for _, size := range readBufSizes {
			t.Run(tt.name+"/buf"+strconv.Itoa(size), func(t *testing.T) {
				t.Parallel()
				maxLine := tt.maxLine
				if maxLine == 0 {
					maxLine = DefaultMaxLine
				}
				lr := newLineReaderSize(strings.NewReader(tt.input), maxLine, size)
				got, err := collect(t, lr)
				require.ErrorIs(t, err, io.EOF)
				require.Equal(t, tt.want, got)
				wantLines, wantOversized := refLines([]byte(tt.input), maxLine)
				require.Equal(t, wantLines, got, "reference model")
				require.Equal(t, wantOversized, lr.Oversized())
			})
		}
	}
}

func TestLineReaderDefaultCap(t *testing.T) {
	t.Parallel()
	require.Equal(t, DefaultMaxLine, NewLineReader(strings.NewReader(""), 0).maxLine)
	require.Equal(t, DefaultMaxLine, NewLineReader(strings.NewReader(""), -1).maxLine)
	require.Equal(t, 100, NewLineReader(strings.NewReader(""), 100).maxLine)
}

type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestLineReaderReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("pipe broke")
	lr := NewLineReader(&failingReader{data: []byte("a\npartial"), err: boom}, 0)
	got, err := collect(t, lr)
	require.ErrorIs(t, err, boom)
	require.Equal(t, []string{"a", "partial"}, got)
}

// patternReader yields n bytes of a deterministic pattern, never holding
// more than the caller's buffer, so tests can feed lines of hundreds of MiB.
type patternReader struct {
	off, n int64
}

func patternByte(i int64) byte { return 'a' + byte(i%23) }

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-r.off)]
	for i := range p {
		p[i] = patternByte(r.off + int64(i))
	}
	r.off += int64(len(p))
	return len(p), nil
}

func hugeLineInput(n int64, rest string) io.Reader {
	return io.MultiReader(&patternReader{n: n}, strings.NewReader("\n"+rest))
}

func TestLineReaderHugeLineOverCap(t *testing.T) {
	t.Parallel()
	const size = 100 << 20
	lr := NewLineReader(hugeLineInput(size, `{"type":"result","is_error":false}`+"\n"), DefaultMaxLine)

	line, err := lr.Next()
	require.NoError(t, err)
	require.Equal(t, marker(size, DefaultMaxLine), string(line))
	m := ParseMessage(line)
	require.True(t, m.JSON)
	require.Equal(t, TypeLineTooLarge, m.Type)
	require.Equal(t, 1, lr.Oversized())
	require.LessOrEqual(t, cap(lr.long), keepLineBuf, "the huge line's buffer must not be kept")

	line, err = lr.Next()
	require.NoError(t, err)
	require.Equal(t, `{"type":"result","is_error":false}`, string(line))
	_, err = lr.Next()
	require.ErrorIs(t, err, io.EOF)
}

func TestLineReaderBigLineUnderCap(t *testing.T) {
	t.Parallel()
	const size = 20 << 20
	lr := NewLineReader(hugeLineInput(size, "tail\n"), DefaultMaxLine)

	line, err := lr.Next()
	require.NoError(t, err)
	require.Len(t, line, size)
	want := crc32.NewIEEE()
	_, err = io.Copy(want, &patternReader{n: size})
	require.NoError(t, err)
	require.Equal(t, want.Sum32(), crc32.ChecksumIEEE(line), "the line must be returned intact")
	require.Zero(t, lr.Oversized())

	line, err = lr.Next()
	require.NoError(t, err)
	require.Equal(t, "tail", string(line))
	require.LessOrEqual(t, cap(lr.long), keepLineBuf, "buffers must shrink back after a big line")
	_, err = lr.Next()
	require.ErrorIs(t, err, io.EOF)
}

// TestLineReaderFixturesZeroCopy checks that lines that fit the read buffer
// are returned without allocating: reading every fixture line costs the same
// allocations as reading an empty input. Not parallel: AllocsPerRun forbids it.
func TestLineReaderFixturesZeroCopy(t *testing.T) {
	lines, _ := fixtureLines(t)
	var data []byte
	for _, l := range lines {
		data = append(append(data, l...), '\n')
	}
	readAll := func(input []byte) func() {
		return func() {
			lr := NewLineReader(bytes.NewReader(input), 0)
			for {
				if _, err := lr.Next(); err != nil {
					return
				}
			}
		}
	}
	empty := testing.AllocsPerRun(10, readAll(nil))
	full := testing.AllocsPerRun(10, readAll(data))
	require.Equal(t, empty, full, "allocations must not grow with the number of lines (%d)", len(lines))
}

func FuzzLineReader(f *testing.F) {
	for _, s := range []string{"", "a\nb", "a\r\nb\r\n", "\r\n\r\n", "x\r", strings.Repeat("z", 50) + "\r\n", "\n\n\n", "a\r\r\n"} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(7))
	}
	data, err := os.ReadFile(fixtureDir + "/you-agent-factory-partial-messages-2.1.220.ndjson")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data, uint8(200))
	f.Fuzz(func(t *testing.T, data []byte, capByte uint8) {
		maxLine := int(capByte)
		if maxLine == 0 {
			maxLine = DefaultMaxLine
		}
		for _, size := range readBufSizes {
			lr := newLineReaderSize(bytes.NewReader(data), maxLine, size)
			got, err := collect(t, lr)
			require.ErrorIs(t, err, io.EOF)
			want, oversized := refLines(data, maxLine)
			require.Equal(t, want, got)
			require.Equal(t, oversized, lr.Oversized())

			if oversized == 0 {
				// The lines plus their terminators give back the input, up to \r\n → \n.
				rebuilt := strings.Join(got, "\n")
				if bytes.HasSuffix(data, []byte("\n")) {
					rebuilt += "\n"
				}
				require.Equal(t, string(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))), rebuilt)
			}
		}
	})
}

func BenchmarkLineReader(b *testing.B) {
	lines, _ := fixtureLines(b)
	var data []byte
	for len(data) < 4<<20 { // a realistic mix of fixture lines, about 4 MiB
		for _, l := range lines {
			data = append(append(data, l...), '\n')
		}
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for b.Loop() {
		lr := NewLineReader(bytes.NewReader(data), 0)
		for {
			line, err := lr.Next()
			if err != nil {
				break
			}
			_ = ParseMessage(line)
			n++
		}
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(n), "allocs/line")
}

// A released reader's buffer serves the next reader, which reads its own
// input from the start, with nothing of the first one's left over; the
// released reader only returns an error.
func TestLineReaderRelease(t *testing.T) {
	first := NewLineReader(strings.NewReader("one\ntwo\nthree-without-newline"), 0)
	line, err := first.Next()
	require.NoError(t, err)
	require.Equal(t, "one", string(line))
	first.Release()
	first.Release() // twice: harmless
	_, err = first.Next()
	require.ErrorIs(t, err, errReleased)

	for range 3 {
		second := NewLineReader(strings.NewReader("alpha\nbeta"), 0)
		var got []string
		for {
			line, err := second.Next()
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			got = append(got, string(line))
		}
		require.Equal(t, []string{"alpha", "beta"}, got)
		second.Release()
	}
}
