package protocol

import "encoding/binary"

// A single-pass JSON validator specialised for ParseMessage. It accepts
// exactly what encoding/json.Valid accepts (FuzzParseMessage checks this
// against json.Valid), including its nesting limit, but runs several times
// faster, does not allocate, and records the value tokens of the header keys
// of the top-level object on the way.

// maxNestingDepth is encoding/json's limit on nested objects and arrays.
const maxNestingDepth = 10000

// strSpecial marks the bytes that end the fast path inside a JSON string.
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanObject reports whether b is one JSON object, optionally surrounded by
// whitespace, and stores in h the raw value tokens of its header keys (the
// last occurrence of a repeated key wins, as in encoding/json).
func scanObject(b []byte, h *[hCount][]byte) bool {
	var stack nestingStack
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		keyEnd, ok := scanString(b, i)
		if !ok {
			return false
		}
		slot := headerSlot(b[i:keyEnd])
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		valEnd, ok := scanValue(b, i, 1, &stack)
		if !ok {
			return false
		}
		if slot >= 0 {
			h[slot] = b[i:valEnd]
		}
		i = skipSpace(b, valEnd)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// nestingStack has a bit per nesting level, set when that level is an object.
type nestingStack [maxNestingDepth/64 + 1]uint64

// scanValue validates the JSON value at b[i] (nested inside depth open
// containers) and returns the offset just past it. It is iterative, keeping
// the kind of each open container in isObject.
func scanValue(b []byte, i, depth int, isObject *nestingStack) (int, bool) {
	level := 0 // containers opened by this call
	open := func(object bool) bool {
		level++
		if depth+level > maxNestingDepth {
			return false
		}
		if object {
			isObject[level/64] |= 1 << (level % 64)
		} else {
			isObject[level/64] &^= 1 << (level % 64)
		}
		return true
	}
	inObject := func() bool { return isObject[level/64]&(1<<(level%64)) != 0 }

	var ok bool
	for {
		// A value is expected at b[i] (whitespace before it already skipped).
		if i >= len(b) {
			return 0, false
		}
		switch c := b[i]; {
		case c == '"':
			if i, ok = scanString(b, i); !ok {
				return 0, false
			}
		case c == '{':
			if !open(true) {
				return 0, false
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == '}' {
				i++
				level--
				break
			}
			if i, ok = scanKey(b, i); !ok {
				return 0, false
			}
			continue
		case c == '[':
			if !open(false) {
				return 0, false
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == ']' {
				i++
				level--
				break
			}
			continue
		case c == '-' || c >= '0' && c <= '9':
			if i, ok = scanNumber(b, i); !ok {
				return 0, false
			}
		case c == 't':
			if i, ok = scanLiteral(b, i, "true"); !ok {
				return 0, false
			}
		case c == 'f':
			if i, ok = scanLiteral(b, i, "false"); !ok {
				return 0, false
			}
		case c == 'n':
			if i, ok = scanLiteral(b, i, "null"); !ok {
				return 0, false
			}
		default:
			return 0, false
		}

		// A value ended at i: close containers or move to the next element.
		for {
			if level == 0 {
				return i, true
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return 0, false
			}
			c := b[i]
			if c == ',' {
				i = skipSpace(b, i+1)
				if inObject() {
					if i, ok = scanKey(b, i); !ok {
						return 0, false
					}
				}
				break
			}
			if inObject() && c == '}' || !inObject() && c == ']' {
				i++
				level--
				continue
			}
			return 0, false
		}
	}
}

// scanKey validates `"key" :` at b[i] and returns the offset of the value
// after it, whitespace skipped.
func scanKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	i, ok := scanString(b, i)
	if !ok {
		return 0, false
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	return skipSpace(b, i+1), true
}

// scanString validates the string token at b[i] (b[i] == '"') and returns
// the offset just past its closing quote. Like encoding/json, it accepts
// any byte from 0x20 up, valid UTF-8 or not.
func scanString(b []byte, i int) (int, bool) {
	j := i + 1
	for {
		// Skip 8 plain bytes at a time, then find the special byte one by one.
		for j+8 <= len(b) && !hasSpecial(binary.LittleEndian.Uint64(b[j:])) {
			j += 8
		}
		for j < len(b) && !strSpecial[b[j]] {
			j++
		}
		if j >= len(b) {
			return 0, false
		}
		switch b[j] {
		case '"':
			return j + 1, true
		case '\\':
			if j+1 >= len(b) {
				return 0, false
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return 0, false
				}
				j += 6
			default:
				return 0, false
			}
		default: // a control character
			return 0, false
		}
	}
}

// hasSpecial reports whether any of the 8 bytes in x is a control character,
// '"' or '\\' (the classic SWAR tests "has a byte less than n" and "has a
// zero byte"; both are exact about whether such a byte exists).
func hasSpecial(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	less := (x - ones*0x20) & ^x
	quote := x ^ (ones * '"')
	backslash := x ^ (ones * '\\')
	zeroQuote := (quote - ones) & ^quote
	zeroBackslash := (backslash - ones) & ^backslash
	return (less|zeroQuote|zeroBackslash)&highs != 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber validates the number at b[i] and returns the offset past it.
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return 0, false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return 0, false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i, true
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}
