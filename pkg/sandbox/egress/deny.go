package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Range is one range of addresses the egress deny-list refuses by default,
// with what kind of address it holds.
type Range struct {
	Prefix netip.Prefix
	Kind   string
}

// DeniedRanges are the ranges the proxy refuses unless the operator allows
// them (Deny): what is on the worker's own machine and network, and what
// is not a host at all. The first range that holds an address names its
// kind, so the narrower ranges come first.
var DeniedRanges = mustRanges(
	"169.254.169.254/32 cloud metadata",
	"fd00:ec2::254/128 cloud metadata",
	"0.0.0.0/8 unspecified",
	"10.0.0.0/8 private",
	"100.64.0.0/10 shared (carrier-grade NAT)",
	"127.0.0.0/8 loopback",
	"169.254.0.0/16 link-local",
	"172.16.0.0/12 private",
	"192.0.0.0/24 reserved (IETF protocol assignments)",
	"192.168.0.0/16 private",
	"198.18.0.0/15 reserved (benchmarking)",
	"224.0.0.0/4 multicast",
	"240.0.0.0/4 reserved (and broadcast)",
	"::/128 unspecified",
	"::1/128 loopback",
	"::/96 IPv4-compatible",
	"100::/64 discard",
	"fc00::/7 private (unique local)",
	"fe80::/10 link-local",
	"fec0::/10 site-local",
	"ff00::/8 multicast",
)

// embedsIPv4 are IPv6 ranges whose addresses carry an IPv4 address a
// translator on the way may reach (NAT64, 6to4): that address is checked
// too. IPv4-mapped addresses (::ffff:0:0/96) are unmapped before anything.
var embedsIPv4 = []struct {
	prefix netip.Prefix
	at     int // byte offset of the IPv4 address
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12},
	{netip.MustParsePrefix("2002::/16"), 2},
}

func mustRanges(specs ...string) []Range {
	out := make([]Range, len(specs))
	for i, s := range specs {
		p, kind, _ := strings.Cut(s, " ")
		out[i] = Range{Prefix: netip.MustParsePrefix(p), Kind: kind}
	}
	return out
}

// Deny is the worker's egress deny-list: DeniedRanges, less the ranges
// the operator allows (--egress-allow-private). The zero value refuses
// every range of DeniedRanges.
type Deny struct {
	allowed []netip.Prefix
}

// AllowFlag names the worker flag that allows ranges, for messages.
const AllowFlag = "--egress-allow-private"

// ParseAllow parses --egress-allow-private: comma-separated CIDR prefixes
// or addresses (an address is its own /32 or /128), empty for none.
func ParseAllow(s string) (Deny, error) {
	var d Deny
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			ip, aerr := netip.ParseAddr(f)
			if aerr != nil || ip.Zone() != "" {
				return Deny{}, fmt.Errorf("%s: %q is not a CIDR prefix or an IP address", AllowFlag, f)
			}
			p = netip.PrefixFrom(ip, ip.BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		d.allowed = append(d.allowed, p.Masked())
	}
	return d, nil
}

// Allow returns d with the given prefixes allowed too.
func (d Deny) Allow(prefixes ...netip.Prefix) Deny {
	out := Deny{allowed: append([]netip.Prefix(nil), d.allowed...)}
	for _, p := range prefixes {
		out.allowed = append(out.allowed, p.Masked())
	}
	return out
}

// String spells the allowed ranges as the flag does.
func (d Deny) String() string {
	s := make([]string, len(d.allowed))
	for i, p := range d.allowed {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Denied returns the kind of a denied address ("loopback", "cloud
// metadata", …), or "" when ip may be reached: a public address, or one
// in a range the operator allows. ip may be IPv4-mapped.
func (d Deny) Denied(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.WithZone("").Unmap()
	if k := d.deniedOne(ip); k != "" {
		return k
	}
	for _, e := range embedsIPv4 {
		if e.prefix.Contains(ip) {
			b := ip.As16()
			v4 := netip.AddrFrom4([4]byte(b[e.at : e.at+4]))
			if k := d.deniedOne(v4); k != "" {
				return k + " (embedded in " + ip.String() + ")"
			}
		}
	}
	return ""
}

func (d Deny) deniedOne(ip netip.Addr) string {
	for _, p := range d.allowed {
		if p.Contains(ip) {
			return ""
		}
	}
	for _, r := range DeniedRanges {
		if r.Prefix.Contains(ip) {
			return r.Kind
		}
	}
	return ""
}

// wellKnownNames are names that stand for a denied address wherever they
// are resolved: an allow entry naming one is checked as that address.
var wellKnownNames = map[string]netip.Addr{
	"localhost":                netip.MustParseAddr("127.0.0.1"),
	"metadata.google.internal": netip.MustParseAddr("169.254.169.254"),
	"metadata":                 netip.MustParseAddr("169.254.169.254"),
	"instance-data":            netip.MustParseAddr("169.254.169.254"),
}

// ruleAddr is the address an allow entry stands for at validation: its IP
// literal, or the address of a well-known name (also below "localhost").
func ruleAddr(r Rule) (netip.Addr, bool) {
	if r.IP.IsValid() {
		return r.IP, true
	}
	if r.Host == "localhost" || strings.HasSuffix(r.Host, ".localhost") {
		return wellKnownNames["localhost"], true
	}
	if r.Suffix {
		return netip.Addr{}, false
	}
	ip, ok := wellKnownNames[r.Host]
	return ip, ok
}

// DeniedError is an allow entry naming an address the worker's deny-list
// refuses. Its status code is Code (network_not_allowed).
type DeniedError struct {
	// Field is the entry's place in the job, "network.allow[i]".
	Field string
	Entry string
	Addr  netip.Addr
	Kind  string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("%s: %q names %s (%s), which this worker's egress deny-list refuses (the operator may allow a range with %s)",
		e.Field, e.Entry, e.Addr, e.Kind, AllowFlag)
}

// CheckDeny returns a *DeniedError for the first allow entry that names a
// denied address: an IP literal in a denied range, or a well-known name of
// one ("localhost", "metadata.google.internal"). Names are checked again
// by the proxy after it resolves them.
func (p Policy) CheckDeny(d Deny) error {
	if p.Mode != Allow {
		return nil
	}
	for i, r := range p.Allow {
		ip, ok := ruleAddr(r)
		if !ok {
			continue
		}
		if k := d.Denied(ip); k != "" {
			return &DeniedError{Field: fmt.Sprintf("network.allow[%d]", i), Entry: r.String(), Addr: ip, Kind: k}
		}
	}
	return nil
}

// IsNotAllowed reports whether err is a job's network refused by this
// worker's settings (--network-max or the deny-list): status code Code.
func IsNotAllowed(err error) bool {
	var na *NotAllowedError
	var de *DeniedError
	return errors.As(err, &na) || errors.As(err, &de)
}
