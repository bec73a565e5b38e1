package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// maxHost bounds a host as a request or an allow entry spells it.
const maxHost = 300

// parseHost reads a host the way the programs behind the proxy would
// (inet_aton and the WHATWG URL parser): an IPv6 literal, bracketed or
// not; an IPv4 address in any of its spellings (dotted decimal, one to
// four parts, each decimal, octal with a leading 0 or hex with 0x:
// "2130706433", "0177.0.0.1", "0x7f.1", "127.1"), a trailing dot
// allowed; or else a DNS name, lower-cased without its trailing dot. A
// host that ends in a number but is no IPv4 address, or that is neither a
// name nor an address, is an error. An IPv4-mapped IPv6 address is
// returned as its IPv4 address.
func parseHost(h string) (netip.Addr, string, error) {
	if h == "" || len(h) > maxHost {
		return netip.Addr{}, "", fmt.Errorf("host must be 1 to %d bytes", maxHost)
	}
	if inner, ok := strings.CutPrefix(h, "["); ok {
		inner, ok = strings.CutSuffix(inner, "]")
		if !ok {
			return netip.Addr{}, "", fmt.Errorf("host %q: unbalanced '['", h)
		}
		return parseIPv6(h, inner)
	}
	if strings.Contains(h, ":") {
		return parseIPv6(h, h)
	}
	name := strings.ToLower(h)
	name = strings.TrimSuffix(name, ".")
	labels := strings.Split(name, ".")
	if isNumber(labels[len(labels)-1]) {
		ip, ok := parseIPv4(labels)
		if !ok {
			return netip.Addr{}, "", fmt.Errorf("host %q ends in a number but is not an IPv4 address", h)
		}
		return ip, "", nil
	}
	if err := checkName(name); err != nil {
		return netip.Addr{}, "", err
	}
	return netip.Addr{}, name, nil
}

func parseIPv6(h, inner string) (netip.Addr, string, error) {
	ip, err := netip.ParseAddr(inner)
	if err != nil || !ip.Is6() {
		return netip.Addr{}, "", fmt.Errorf("host %q is not an IPv6 address", h)
	}
	if ip.Zone() != "" {
		return netip.Addr{}, "", fmt.Errorf("host %q: an IP with a zone is not allowed", h)
	}
	return ip.Unmap(), "", nil
}

// isNumber reports whether a label is a number as the WHATWG URL parser
// sees one ("ends in a number"): digits, or 0x followed by hex digits.
func isNumber(s string) bool {
	if s == "" {
		return false
	}
	if rest, ok := strings.CutPrefix(s, "0x"); ok {
		return allIn(rest, "0123456789abcdef")
	}
	return allIn(s, "0123456789")
}

func allIn(s, set string) bool {
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(set, rune(s[i])) {
			return false
		}
	}
	return true
}

// parseIPv4 reads one to four lower-cased parts as inet_aton does: every
// part but the last is one byte, the last fills the bytes left.
func parseIPv4(parts []string) (netip.Addr, bool) {
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint64
	for i, p := range parts {
		n, ok := parsePart(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 255 {
				return netip.Addr{}, false
			}
			v = v<<8 | n
			continue
		}
		left := uint(8 * (5 - len(parts)))
		if n >= 1<<left {
			return netip.Addr{}, false
		}
		v = v<<left | n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parsePart reads one part: 0x hex (empty after 0x is 0), a leading 0
// octal, else decimal.
func parsePart(p string) (uint64, bool) {
	base := 10
	switch {
	case strings.HasPrefix(p, "0x"):
		p, base = p[2:], 16
		if p == "" {
			return 0, true
		}
	case len(p) > 1 && p[0] == '0':
		p, base = p[1:], 8
	}
	if p == "" || len(p) > 32 {
		return 0, false
	}
	n, err := strconv.ParseUint(p, base, 64)
	if err != nil || n > 1<<32 {
		return 0, false
	}
	return n, true
}
