package journal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// WAL record layout (little-endian), see doc.go:
//
//	[uint32 length][uint64 seq][uint32 crc32c][length bytes of data]
//
// The CRC (Castagnoli) covers the first 12 header bytes and the data, so a
// damaged length or seq is detected as well as damaged data.
const headerSize = 16

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// readBufSize is the buffer of sequential WAL readers and the window of the
// resync search.
const readBufSize = 64 << 10

func recordCRC(h []byte, data []byte) uint32 {
	return crc32.Update(crc32.Update(0, crcTable, h[:12]), crcTable, data)
}

// putHeader fills h with the header of a record holding seq and data.
func putHeader(h *[headerSize]byte, seq uint64, data []byte) {
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(data)))
	binary.LittleEndian.PutUint64(h[4:12], seq)
	binary.LittleEndian.PutUint32(h[12:16], recordCRC(h[:], data))
}

// appendRecord appends the encoded record to dst.
func appendRecord(dst []byte, seq uint64, data []byte) []byte {
	var h [headerSize]byte
	putHeader(&h, seq, data)
	dst = append(dst, h[:]...)
	return append(dst, data...)
}

// header is a decoded record header; it is not yet known to be valid.
type header struct {
	length uint32
	seq    uint64
	crc    uint32
}

func parseHeader(h []byte) header {
	return header{
		length: binary.LittleEndian.Uint32(h[0:4]),
		seq:    binary.LittleEndian.Uint64(h[4:12]),
		crc:    binary.LittleEndian.Uint32(h[12:16]),
	}
}

// plausible reports whether a header at off could start a valid record in a
// file of size bytes whose previous valid record had lastSeq.
func (h header) plausible(off, size int64, lastSeq uint64) bool {
	return h.length <= MaxLineBytes && off+headerSize+int64(h.length) <= size && h.seq > lastSeq
}

// walRecord is one valid record found by scanWAL.
type walRecord struct {
	off  int64  // offset of the header in the file
	seq  uint64 // Fleet-Seq of the line
	data []byte // the line; only valid during the callback
}

func (r walRecord) end() int64 { return r.off + headerSize + int64(len(r.data)) }

// span is a byte range [from, to) of a WAL.
type span struct{ from, to int64 }

// scanResult summarises a scan.
type scanResult struct {
	records  int
	lastSeq  uint64 // seq of the last valid record, 0 if none
	validEnd int64  // end offset of the last valid record, 0 if none
	corrupt  []span // ranges not covered by valid records, in file order
	size     int64
}

// tailOnly reports whether the only damage is a torn or corrupt tail, which
// truncating the file to validEnd removes without dropping a valid record.
func (s scanResult) tailOnly() bool {
	return len(s.corrupt) == 1 && s.corrupt[0].to == s.size
}

func (s scanResult) corruptBytes() int64 {
	var n int64
	for _, c := range s.corrupt {
		n += c.to - c.from
	}
	return n
}

// scanWAL decodes the records in r[0:size] and calls fn (when not nil) for
// each valid one, in file order. A record is valid when its length fits in
// the file and under MaxLineBytes, its CRC matches and its seq is greater
// than the previous valid record's. Bytes that are not a valid record are
// skipped: the scanner searches forward for the next offset where a valid
// record starts, so damage in the middle of a file never hides the valid
// records after it, and reports the skipped ranges in corrupt. scanWAL never
// panics on arbitrary input; it returns an error only for I/O errors or an
// error from fn.
func scanWAL(r io.ReaderAt, size int64, fn func(walRecord) error) (scanResult, error) {
	res := scanResult{size: size}
	var buf []byte
	off := int64(0)
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), readBufSize)
	for off < size {
		rec, ok, err := readNext(br, off, size, res.lastSeq, &buf)
		if err != nil {
			return res, err
		}
		if ok {
			if fn != nil {
				if err := fn(rec); err != nil {
					return res, err
				}
			}
			res.records++
			res.lastSeq = rec.seq
			off = rec.end()
			res.validEnd = off
			continue
		}
		next, found, err := resync(r, off+1, size, res.lastSeq, &buf)
		if err != nil {
			return res, err
		}
		if !found {
			res.corrupt = append(res.corrupt, span{off, size})
			break
		}
		res.corrupt = append(res.corrupt, span{off, next})
		off = next
		br.Reset(io.NewSectionReader(r, off, size-off))
	}
	return res, nil
}

// readNext reads the record at off from br (positioned at off). ok is false
// when the bytes there are not a valid record; br is then left at an
// unspecified position.
func readNext(br *bufio.Reader, off, size int64, lastSeq uint64, buf *[]byte) (walRecord, bool, error) {
	if size-off < headerSize {
		return walRecord{}, false, nil
	}
	var hb [headerSize]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return walRecord{}, false, eofIsInvalid(err)
	}
	h := parseHeader(hb[:])
	if !h.plausible(off, size, lastSeq) {
		return walRecord{}, false, nil
	}
	data := grow(buf, int(h.length))
	if _, err := io.ReadFull(br, data); err != nil {
		return walRecord{}, false, eofIsInvalid(err)
	}
	if recordCRC(hb[:], data) != h.crc {
		return walRecord{}, false, nil
	}
	return walRecord{off: off, seq: h.seq, data: data}, true, nil
}

// resync returns the first offset >= from where a valid record starts.
func resync(r io.ReaderAt, from, size int64, lastSeq uint64, buf *[]byte) (int64, bool, error) {
	win := make([]byte, readBufSize+headerSize)
	for base := from; base+headerSize <= size; base += readBufSize {
		n := int(min(int64(len(win)), size-base))
		if err := readAtFull(r, win[:n], base); err != nil {
			return 0, false, err
		}
		for i := 0; i < readBufSize && i+headerSize <= n; i++ {
			off := base + int64(i)
			h := parseHeader(win[i : i+headerSize])
			if !h.plausible(off, size, lastSeq) {
				continue
			}
			data := grow(buf, int(h.length))
			if err := readAtFull(r, data, off+headerSize); err != nil {
				return 0, false, err
			}
			if recordCRC(win[i:i+headerSize], data) == h.crc {
				return off, true, nil
			}
		}
	}
	return 0, false, nil
}

func grow(buf *[]byte, n int) []byte {
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	return (*buf)[:n]
}

func readAtFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read at offset %d: %w", off, err)
}

// eofIsInvalid turns a short read (the file ended early) into "not a valid
// record" and keeps real I/O errors.
func eofIsInvalid(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}
