package envcache

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// Bounds of a script's inputs.
const (
	MaxInputs       = 64
	MaxInputPathLen = 1024
)

// ParseInputs returns the paths a setup script names on its "# inputs:"
// lines, in order, without duplicates. A line is an input line when,
// after leading blanks, it starts with "#", optional blanks and
// "inputs:"; the rest of the line is a blank-separated list of paths
// relative to the checkout. A path that is absolute, leaves the checkout
// (".."), is not clean, or is not valid UTF-8 is an error naming it.
func ParseInputs(script string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for n, line := range strings.Split(script, "\n") {
		rest, ok := inputLine(line)
		if !ok {
			continue
		}
		for _, p := range strings.Fields(rest) {
			if err := checkInput(p); err != nil {
				return nil, fmt.Errorf("envcache: setup line %d: input %q: %w", n+1, clip(p), err)
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			out = append(out, p)
			if len(out) > MaxInputs {
				return nil, fmt.Errorf("envcache: setup names more than %d inputs", MaxInputs)
			}
		}
	}
	return out, nil
}

func inputLine(line string) (string, bool) {
	s := strings.TrimLeft(line, " \t")
	s, ok := strings.CutPrefix(s, "#")
	if !ok {
		return "", false
	}
	return strings.CutPrefix(strings.TrimLeft(s, " \t"), "inputs:")
}

func checkInput(p string) error { return checkRel(p, MaxInputPathLen) }

// checkRel checks a clean relative path inside the checkout.
func checkRel(p string, maxLen int) error {
	switch {
	case len(p) > maxLen:
		return fmt.Errorf("longer than %d bytes", maxLen)
	case !utf8.ValidString(p) || strings.ContainsRune(p, 0):
		return fmt.Errorf("not valid UTF-8 text")
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("must be relative to the checkout")
	case path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("must be a clean path inside the checkout")
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
