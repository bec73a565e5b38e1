package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Mode is how much of the network a sandbox may reach, ordered: None < Allow
// < Open.
type Mode int

// Modes of a Policy.
const (
	// None reaches only what the worker forwards into the sandbox (the model
	// gateway).
	None Mode = iota
	// Allow adds HTTP and HTTPS, through the worker's proxy, to the hosts
	// and ports of Policy.Allow.
	Allow
	// Open reaches anything the worker's host reaches.
	Open
)

// String is the mode's name as the job field and the flags spell it.
func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Allow:
		return "allow"
	case Open:
		return "open"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode parses "none", "allow" or "open" (the --network-max flag).
func ParseMode(s string) (Mode, error) {
	switch s {
	case "none":
		return None, nil
	case "allow":
		return Allow, nil
	case "open":
		return Open, nil
	}
	return 0, fmt.Errorf("network: %q is not a network mode (none, allow, open)", s)
}

// Rule is one allow-list entry.
type Rule struct {
	// Host is the lower-cased name without a trailing dot, the suffix after
	// "*." when Suffix, or the IP literal's canonical form when IP is valid.
	Host   string
	Suffix bool
	IP     netip.Addr
	// Port is the one port admitted, or 0 for 80 and 443.
	Port int
}

// String spells the rule as an allow entry.
func (r Rule) String() string {
	h := r.Host
	if r.Suffix {
		h = "*." + h
	}
	if r.IP.Is6() {
		h = "[" + h + "]"
	}
	if r.Port != 0 {
		h += ":" + strconv.Itoa(r.Port)
	}
	return h
}

// Policy is a decoded `network` job value.
type Policy struct {
	Mode  Mode
	Allow []Rule // only with Mode Allow; never empty there
}

// String spells the policy as the job field does.
func (p Policy) String() string {
	if p.Mode != Allow {
		return strconv.Quote(p.Mode.String())
	}
	hosts := make([]string, len(p.Allow))
	for i, r := range p.Allow {
		hosts[i] = r.String()
	}
	b, _ := json.Marshal(map[string][]string{"allow": hosts})
	return string(b)
}

// maxRules bounds an allow list.
const maxRules = 256

// ErrInvalid is wrapped by every error of Parse and ParseFlag.
var ErrInvalid = errors.New("network: invalid value")

// Parse decodes the job field `network`: "none", "open" or
// {"allow":["host", "*.suffix", "10.0.0.1:8080", …]}. An absent field is
// the caller's default (ParseFlag of --network-default), not Parse's.
func Parse(raw []byte) (Policy, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return Policy{}, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		switch s {
		case "none":
			return Policy{Mode: None}, nil
		case "open":
			return Policy{Mode: Open}, nil
		}
		return Policy{}, fmt.Errorf(`%w: %q is not "none", "open" or {"allow":[…]}`, ErrInvalid, s)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return Policy{}, fmt.Errorf(`%w: want "none", "open" or {"allow":[…]}`, ErrInvalid)
	}
	for k := range obj {
		if k != "allow" {
			return Policy{}, fmt.Errorf("%w: unknown key %q (only \"allow\")", ErrInvalid, k)
		}
	}
	var hosts []string
	if err := json.Unmarshal(obj["allow"], &hosts); err != nil || len(hosts) == 0 {
		return Policy{}, fmt.Errorf("%w: \"allow\" must be a non-empty list of strings", ErrInvalid)
	}
	if len(hosts) > maxRules {
		return Policy{}, fmt.Errorf("%w: \"allow\" lists %d entries (at most %d)", ErrInvalid, len(hosts), maxRules)
	}
	p := Policy{Mode: Allow, Allow: make([]Rule, 0, len(hosts))}
	for i, h := range hosts {
		r, err := ParseRule(h)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: allow[%d]: %v", ErrInvalid, i, err)
		}
		p.Allow = append(p.Allow, r)
	}
	return p, nil
}

// ParseFlag parses --network-default: "none", "open" or an allow object.
func ParseFlag(s string) (Policy, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		return Parse([]byte(s))
	}
	return Parse([]byte(strconv.Quote(s)))
}

// ParseRule parses one allow entry.
func ParseRule(entry string) (Rule, error) {
	if entry == "" || len(entry) > 300 {
		return Rule{}, fmt.Errorf("entry %q must be 1 to 300 bytes", entry)
	}
	host, port := entry, 0
	if h, p, err := net.SplitHostPort(entry); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || p != strconv.Itoa(n) {
			return Rule{}, fmt.Errorf("entry %q: port %q must be 1 to 65535", entry, p)
		}
		host, port = h, n
	} else if strings.HasPrefix(entry, "[") && strings.HasSuffix(entry, "]") {
		host = entry[1 : len(entry)-1]
	} else if strings.Count(entry, ":") == 1 || strings.HasPrefix(entry, "[") {
		return Rule{}, fmt.Errorf("entry %q: %v", entry, err)
	}
	r := Rule{Port: port}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Suffix, host = true, rest
	}
	ip, name, err := parseHost(host)
	if err != nil {
		return Rule{}, fmt.Errorf("entry %q: %v", entry, err)
	}
	if ip.IsValid() {
		if r.Suffix {
			return Rule{}, fmt.Errorf("entry %q: a suffix of an IP address", entry)
		}
		return Rule{Host: ip.String(), IP: ip, Port: port}, nil
	}
	r.Host = name
	return r, nil
}

// checkName accepts a DNS name: dot-separated labels of letters, digits,
// '-' and '_', none empty, at most 253 bytes.
func checkName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("host name must be 1 to 253 bytes")
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("host name %q has an empty or over-long label", h)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host name %q holds %q", h, c)
			}
		}
	}
	return nil
}

// NotAllowedError is a job asking for more network than --network-max.
type NotAllowedError struct {
	Asked, Max Mode
}

// Code is the status error code (docs/contained.md).
const Code = "network_not_allowed"

func (e *NotAllowedError) Error() string {
	return fmt.Sprintf("network: the job asks for %q and this worker allows at most %q (--network-max)", e.Asked, e.Max)
}

// CheckMax returns a *NotAllowedError when p asks for more than max.
func (p Policy) CheckMax(max Mode) error {
	if p.Mode > max {
		return &NotAllowedError{Asked: p.Mode, Max: max}
	}
	return nil
}

// Admits reports whether the policy lets a request to host:port through the
// proxy, and the rule that did. host is a name or an IP address in any
// spelling parseHost reads ("0x7f.1", "[::ffff:127.0.0.1]", "Example.COM.").
func (p Policy) Admits(host string, port int) (Rule, bool) {
	if p.Mode == Open {
		return Rule{}, true
	}
	if p.Mode != Allow {
		return Rule{}, false
	}
	ip, name, err := parseHost(host)
	if err != nil {
		return Rule{}, false
	}
	isIP := ip.IsValid()
	for _, r := range p.Allow {
		if r.Port == 0 && port != 80 && port != 443 || r.Port != 0 && r.Port != port {
			continue
		}
		switch {
		case r.IP.IsValid():
			if isIP && ip == r.IP {
				return r, true
			}
		case isIP:
		case r.Suffix:
			if strings.HasSuffix(name, "."+r.Host) {
				return r, true
			}
		case name == r.Host:
			return r, true
		}
	}
	return Rule{}, false
}

// ForJob is the policy of one job: its `network` field (raw JSON; empty or
// null when absent, which takes def) checked against max and against the
// worker's deny-list. Errors wrap ErrInvalid (a bad value) or are a
// *NotAllowedError or a *DeniedError (code network_not_allowed,
// IsNotAllowed); each is the job's failure before any process starts.
func ForJob(raw []byte, def Policy, max Mode, deny Deny) (Policy, error) {
	p := def
	if t := bytes.TrimSpace(raw); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		var err error
		if p, err = Parse(t); err != nil {
			return Policy{}, err
		}
	}
	if err := p.CheckMax(max); err != nil {
		return Policy{}, err
	}
	if err := p.CheckDeny(deny); err != nil {
		return Policy{}, err
	}
	return p, nil
}
