package storage

import (
	"fmt"
	"strings"
)

// Key limits.
const (
	// MaxKeyBytes is the longest key any backend accepts.
	MaxKeyBytes = 480
	// MaxSegmentBytes is the longest '/'-separated segment: the file-name
	// limit of common file systems, so FS can store every valid key.
	MaxSegmentBytes = 255
)

// ValidateKey reports whether key is a valid Store key, returning an error
// wrapping ErrInvalidKey when it is not. A valid key is 1 to MaxKeyBytes bytes
// of '/'-separated segments; each segment is non-empty, made of
// [A-Za-z0-9._=-], at most MaxSegmentBytes long, and is neither "." nor "..". So a valid key never starts or
// ends with '/', never holds "//", and never climbs out of a directory: the FS
// backend maps keys to paths under its root without further checks, and the
// NATS KV backend maps them to KV keys one to one. Every backend calls it
// before touching its medium.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: key of %d bytes is longer than %d", ErrInvalidKey, len(key), MaxKeyBytes)
	}
	start := 0
	for i := 0; i <= len(key); i++ {
		if i < len(key) && key[i] != '/' {
			if !keyByte(key[i]) {
				return fmt.Errorf("%w: %q has byte %#x at offset %d (allowed: A-Z a-z 0-9 . _ = - and / between segments)", ErrInvalidKey, key, key[i], i)
			}
			continue
		}
		switch seg := key[start:i]; seg {
		case "":
			return fmt.Errorf("%w: %q has an empty segment at offset %d", ErrInvalidKey, key, start)
		case ".", "..":
			return fmt.Errorf("%w: %q has a %q segment", ErrInvalidKey, key, seg)
		}
		if i-start > MaxSegmentBytes {
			return fmt.Errorf("%w: %q has a segment of %d bytes (at most %d)", ErrInvalidKey, key, i-start, MaxSegmentBytes)
		}
		start = i + 1
	}
	return nil
}

// validSegment reports whether s is one valid key segment.
func validSegment(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > MaxSegmentBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !keyByte(s[i]) {
			return false
		}
	}
	return true
}

func keyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '=' || c == '-'
}

// prefixDir returns the directory part of a List prefix: everything up to and
// including its last '/' ("" when there is none). ok is false when no valid
// key can start with prefix, in which case List returns no keys.
func prefixDir(prefix string) (dir string, ok bool) {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return "", prefixTailOK(prefix)
	}
	dir = prefix[:i+1]
	if ValidateKey(dir[:len(dir)-1]) != nil {
		return "", false
	}
	return dir, prefixTailOK(prefix[i+1:])
}

// prefixTailOK reports whether tail can begin a key segment.
func prefixTailOK(tail string) bool {
	for i := 0; i < len(tail); i++ {
		if !keyByte(tail[i]) {
			return false
		}
	}
	return true
}
