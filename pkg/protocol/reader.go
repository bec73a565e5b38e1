package protocol

import (
	"bufio"
	"errors"
	"io"
	"strconv"
	"sync"
)

// DefaultMaxLine is the default line cap of LineReader (64 MiB).
const DefaultMaxLine = 64 << 20

const (
	// readBufSize is the size of the bufio.Reader under a LineReader. Lines
	// that fit are returned straight from it, without a copy.
	readBufSize = 64 << 10
	// keepLineBuf is the largest long-line buffer kept between lines; a
	// bigger one (left by a huge line) is released on the next call.
	keepLineBuf = 1 << 20
)

// LineReader reads stdout lines without ever stalling the writer.
//
// It reads with bufio.Reader.ReadSlice, so a line of any length up to the cap
// is read without a fixed small limit: a line that fits the 64 KiB read buffer
// is returned without a copy; a longer one is copied once into a growing
// buffer, which is released after the line if it grew past 1 MiB. A line over
// the cap is never held: it is read and discarded up to its newline while
// its bytes are counted, and replaced by a marker line. The reader keeps
// reading in every case, so the child never blocks on a full pipe because of us.
//
// A LineReader is not safe for concurrent use.
type LineReader struct {
	br        *bufio.Reader
	maxLine   int
	long      []byte // accumulates a line longer than the read buffer
	marker    []byte
	oversized int
	err       error // sticky error, returned once the pending line is out
	pooled    bool  // br came from readers and goes back with Release
}

// NewLineReader returns a reader with the given cap (<=0 → DefaultMaxLine).
func NewLineReader(r io.Reader, maxLine int) *LineReader {
	return newLineReaderSize(r, maxLine, readBufSize)
}

// readers keeps the read buffers of released LineReaders: a run's reader
// is made per agent run, and 64 KiB made and zeroed per run showed in the
// worker's profile.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufSize) }}

// newLineReaderSize lets tests use a tiny read buffer to exercise long lines.
func newLineReaderSize(r io.Reader, maxLine, bufSize int) *LineReader {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	if bufSize != readBufSize {
		return &LineReader{br: bufio.NewReaderSize(r, bufSize), maxLine: maxLine}
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	return &LineReader{br: br, maxLine: maxLine, pooled: true}
}

// errReleased is what Next returns after Release.
var errReleased = errors.New("protocol: line reader released")

// Release hands the reader's buffer to a later LineReader. The line Next
// returned last must not be used after it, nor the reader (Next returns an
// error). Calling it is optional; calling it twice is harmless.
func (r *LineReader) Release() {
	if r.pooled {
		r.br.Reset(nil)
		readers.Put(r.br)
		r.pooled = false
	}
	r.br, r.long, r.err = nil, nil, errReleased
}

// Next returns the next line without its terminator (\n or \r\n). The slice is
// valid until the next call. A line over the cap is replaced by a marker line
// {"type":"x_fleet_line_too_large","bytes":N,"cap":C}. At EOF a final line
// without newline is returned, then io.EOF.
//
// N is the length of the line without its terminator. A \r is trimmed only
// before a \n: the final line of an input without a trailing newline is
// returned exactly as read. Empty lines are returned as empty slices. A read
// error other than io.EOF is handled like EOF: the pending partial line is
// returned first, then the error on every later call.
func (r *LineReader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if cap(r.long) > keepLineBuf {
		r.long = nil // do not keep a huge buffer after a huge line
	}
	r.long = r.long[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		switch {
		case err == nil: // frag ends with '\n'
			line := frag
			if len(r.long) > 0 {
				r.long = append(r.long, frag...)
				line = r.long
			}
			line = trimTerminator(line)
			if len(line) > r.maxLine {
				return r.tooLarge(int64(len(line))), nil
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			// Allow one byte over the cap: it may be the \r of a \r\n.
			if len(r.long)+len(frag) > r.maxLine+1 {
				return r.discard(int64(len(r.long)), frag)
			}
			r.long = append(r.long, frag...)
		default: // io.EOF or a read error: the line is incomplete
			r.err = err
			line := frag
			if len(r.long) > 0 {
				r.long = append(r.long, frag...)
				line = r.long
			}
			if len(line) > r.maxLine {
				return r.tooLarge(int64(len(line))), nil
			}
			if len(line) > 0 {
				return line, nil
			}
			return nil, err
		}
	}
}

// discard drops the rest of an oversized line, counting its bytes. held is
// how many bytes of it were already accumulated, frag the fragment in hand.
func (r *LineReader) discard(held int64, frag []byte) ([]byte, error) {
	r.long = nil
	n := held + int64(len(frag))
	last := frag[len(frag)-1]
	for {
		frag, err := r.br.ReadSlice('\n')
		n += int64(len(frag))
		switch {
		case err == nil:
			n-- // the \n
			if len(frag) >= 2 && frag[len(frag)-2] == '\r' || len(frag) == 1 && last == '\r' {
				n--
			}
			return r.tooLarge(n), nil
		case errors.Is(err, bufio.ErrBufferFull):
			last = frag[len(frag)-1]
		default:
			r.err = err
			return r.tooLarge(n), nil
		}
	}
}

func (r *LineReader) tooLarge(n int64) []byte {
	r.oversized++
	r.long = r.long[:0]
	if cap(r.long) > keepLineBuf {
		r.long = nil
	}
	r.marker = append(r.marker[:0], `{"type":"`+TypeLineTooLarge+`","bytes":`...)
	r.marker = strconv.AppendInt(r.marker, n, 10)
	r.marker = append(r.marker, `,"cap":`...)
	r.marker = strconv.AppendInt(r.marker, int64(r.maxLine), 10)
	r.marker = append(r.marker, '}')
	return r.marker
}

// trimTerminator removes the \n ending line and a \r before it.
func trimTerminator(line []byte) []byte {
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line
}

// Oversized is how many lines were replaced by a marker.
func (r *LineReader) Oversized() int { return r.oversized }
