package protocol

import (
	"strings"
	"unicode/utf8"
)

// StatusStderrTail returns what a status event carries of the agent's
// stderr: its last MaxStatusStderrTail bytes, valid UTF-8.
func StatusStderrTail(stderr string) string {
	return validUTF8(tail(stderr, MaxStatusStderrTail))
}

// StderrLastLine returns the last non-blank line of stderr, trimmed and cut
// to at most 300 runes: the sentence a failure's message quotes.
func StderrLastLine(stderr string) string {
	lines := strings.Split(strings.TrimRight(validUTF8(stderr), "\n\r\t "), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if utf8.RuneCountInString(l) > 300 {
			l = string([]rune(l)[:299]) + "…"
		}
		return l
	}
	return ""
}
