package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// maxMsgpackDepth bounds the nesting of containers in a msgpack body.
const maxMsgpackDepth = 100

var errMsgpackTruncated = errors.New("truncated value")

// checkMsgpack verifies that data holds exactly one well-formed msgpack value
// whose declared lengths all fit in the bytes that follow them and whose
// nesting is at most maxMsgpackDepth. The msgpack library sizes maps and
// slices from the declared length before reading any element, so a few
// hostile bytes could otherwise make it allocate hundreds of megabytes;
// after this check, every allocation is bounded by len(data).
func checkMsgpack(data []byte) error {
	end, err := skipMsgpack(data, 0, 0)
	if err != nil {
		return err
	}
	if end != len(data) {
		return fmt.Errorf("%d trailing bytes after the value", len(data)-end)
	}
	return nil
}

// skipMsgpack returns the offset just past the value starting at b[i].
func skipMsgpack(b []byte, i, depth int) (int, error) {
	if i >= len(b) {
		return 0, errMsgpackTruncated
	}
	c := b[i]
	i++
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return i, nil
	case c&0xf0 == 0x80: // fixmap
		return skipElems(b, i, 2*uint64(c&0x0f), depth)
	case c&0xf0 == 0x90: // fixarray
		return skipElems(b, i, uint64(c&0x0f), depth)
	case c&0xe0 == 0xa0: // fixstr
		return skipBytes(b, i, uint64(c&0x1f))
	}
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return i, nil
	case 0xc4, 0xd9: // bin8, str8
		return skipSized(b, i, 1, 0)
	case 0xc5, 0xda: // bin16, str16
		return skipSized(b, i, 2, 0)
	case 0xc6, 0xdb: // bin32, str32
		return skipSized(b, i, 4, 0)
	case 0xc7: // ext8: length, type, data
		return skipSized(b, i, 1, 1)
	case 0xc8: // ext16
		return skipSized(b, i, 2, 1)
	case 0xc9: // ext32
		return skipSized(b, i, 4, 1)
	case 0xcc, 0xd0: // uint8, int8
		return skipBytes(b, i, 1)
	case 0xcd, 0xd1: // uint16, int16
		return skipBytes(b, i, 2)
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return skipBytes(b, i, 4)
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return skipBytes(b, i, 8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (plus the type byte)
		return skipBytes(b, i, 1+(uint64(1)<<(c-0xd4)))
	case 0xdc, 0xdd: // array16, array32
		n, next, err := readLen(b, i, 2<<(c-0xdc))
		if err != nil {
			return 0, err
		}
		return skipElems(b, next, n, depth)
	case 0xde, 0xdf: // map16, map32
		n, next, err := readLen(b, i, 2<<(c-0xde))
		if err != nil {
			return 0, err
		}
		return skipElems(b, next, 2*n, depth)
	default: // 0xc1 is never used
		return 0, fmt.Errorf("invalid code 0x%02x at byte %d", c, i-1)
	}
}

// skipElems skips n values of a container, refusing a count that the rest of
// b cannot hold (every value takes at least one byte).
func skipElems(b []byte, i int, n uint64, depth int) (int, error) {
	if n > uint64(len(b)-i) {
		return 0, fmt.Errorf("container at byte %d declares %d values but only %d bytes follow", i, n, len(b)-i)
	}
	if n > 0 && depth >= maxMsgpackDepth {
		return 0, fmt.Errorf("nesting deeper than %d", maxMsgpackDepth)
	}
	var err error
	for ; n > 0; n-- {
		if i, err = skipMsgpack(b, i, depth+1); err != nil {
			return 0, err
		}
	}
	return i, nil
}

// skipSized skips a length-prefixed payload: a lenSize-byte length, extra
// bytes (the ext type), then the payload.
func skipSized(b []byte, i, lenSize int, extra uint64) (int, error) {
	n, next, err := readLen(b, i, lenSize)
	if err != nil {
		return 0, err
	}
	return skipBytes(b, next, n+extra)
}

func skipBytes(b []byte, i int, n uint64) (int, error) {
	if n > uint64(len(b)-i) {
		return 0, errMsgpackTruncated
	}
	return i + int(n), nil
}

// readLen reads a big-endian length of size 1, 2 or 4 bytes.
func readLen(b []byte, i, size int) (uint64, int, error) {
	if len(b)-i < size {
		return 0, 0, errMsgpackTruncated
	}
	switch size {
	case 1:
		return uint64(b[i]), i + 1, nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b[i:])), i + 2, nil
	default:
		return uint64(binary.BigEndian.Uint32(b[i:])), i + 4, nil
	}
}

// probeMsgpack walks the top-level map of a msgpack body and returns its "id"
// and "tenant" string values. It stops at the first malformed byte, keeping
// what it found before, so it works on truncated or otherwise broken bodies.
func probeMsgpack(b []byte) (id, tenant string) {
	if len(b) == 0 {
		return "", ""
	}
	var n uint64
	i := 1
	switch c := b[0]; {
	case c&0xf0 == 0x80:
		n = uint64(c & 0x0f)
	case c == 0xde || c == 0xdf:
		var err error
		if n, i, err = readLen(b, 1, 2<<(c-0xde)); err != nil {
			return "", ""
		}
	default:
		return "", ""
	}
	for ; n > 0; n-- {
		key, next, ok := msgpackStr(b, i)
		if !ok {
			return id, tenant
		}
		if val, _, isStr := msgpackStr(b, next); isStr {
			switch string(key) {
			case "id":
				id = string(val)
			case "tenant":
				tenant = string(val)
			}
		}
		var err error
		if i, err = skipMsgpack(b, next, 0); err != nil {
			return id, tenant
		}
	}
	return id, tenant
}

// msgpackStr reads the str value at b[i].
func msgpackStr(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) {
		return nil, 0, false
	}
	var n uint64
	var err error
	switch c := b[i]; {
	case c&0xe0 == 0xa0:
		n, next = uint64(c&0x1f), i+1
	case c == 0xd9 || c == 0xda || c == 0xdb:
		n, next, err = readLen(b, i+1, 1<<(c-0xd9))
	default:
		return nil, 0, false
	}
	if err != nil || n > uint64(len(b)-next) {
		return nil, 0, false
	}
	end := next + int(n)
	return b[next:end], end, true
}
