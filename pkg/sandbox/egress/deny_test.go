package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// loopbackSpellings are ways of writing a loopback (or this-host) address
// that the programs behind the proxy understand.
var loopbackSpellings = []string{
	"127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.1", "0X7F.0.0.1", "127.1", "127.0.1", "0x7f000001",
	"017700000001", "0x7f.0x0.0x0.0x1", "127.0.0.1.", "127.000.000.001", "[::ffff:127.0.0.1]", "[::FFFF:7F00:1]",
	"[::1]", "[0:0:0:0:0:0:0:1]", "0.0.0.0", "0", "[::]", "localhost", "LOCALHOST.", "LocalHost",
}

// sentinel is a TCP listener that must never be reached through the
// proxy: never reports whether anything but the test's own last
// connection arrived, in order (accept is first in, first out).
type sentinel struct {
	ln   net.Listener
	port int
	got  chan string
}

func newSentinel(t *testing.T) *sentinel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &sentinel{ln: ln, port: ln.Addr().(*net.TCPAddr).Port, got: make(chan string, 100)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(s.got)
				return
			}
			b := make([]byte, 5)
			n, _ := io.ReadFull(c, b)
			s.got <- string(b[:n])
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for range s.got {
		}
	})
	return s
}

// never connects to the sentinel itself and fails if anything came first.
func (s *sentinel) never(t *testing.T) {
	t.Helper()
	c, err := net.Dial("tcp", s.ln.Addr().String())
	require.NoError(t, err)
	_, err = io.WriteString(c, "last!")
	require.NoError(t, err)
	_ = c.Close()
	require.Equal(t, "last!", <-s.got, "the proxy reached the denied listener")
}

// proxyServer serves px on loopback and returns its address.
func proxyServer(t *testing.T, px *Proxy) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: px, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// ask sends one raw request line (CONNECT host:port, or an absolute GET)
// to the proxy and returns the status and X-Proxy-Error.
func ask(t *testing.T, proxy, method, target string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	host := strings.TrimPrefix(target, "http://")
	host, _, _ = strings.Cut(host, "/")
	_, err = fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\n\r\n", method, target, host)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Proxy-Error")
}

// TestProxyRefusesDeniedAddressesHoweverWritten: a job whose allow list
// names loopback in every spelling (as if it had passed validation) gets
// 403 for each, CONNECT and plain HTTP, and a real listener on 127.0.0.1
// is never reached.
func TestProxyRefusesDeniedAddressesHoweverWritten(t *testing.T) {
	s := newSentinel(t)
	entries := make([]string, len(loopbackSpellings))
	for i, h := range loopbackSpellings {
		entries[i] = h + ":" + strconv.Itoa(s.port)
	}
	raw, _ := json.Marshal(map[string][]string{"allow": entries})
	policy, err := Parse(raw)
	require.NoError(t, err)
	var refused []Refusal
	var mu sync.Mutex
	px := proxyServer(t, &Proxy{Policy: policy, OnRefused: func(r Refusal) { mu.Lock(); refused = append(refused, r); mu.Unlock() }})
	for _, h := range loopbackSpellings {
		hp := h + ":" + strconv.Itoa(s.port)
		code, why := ask(t, px, http.MethodConnect, hp)
		require.Equal(t, http.StatusForbidden, code, "CONNECT %s", hp)
		require.Equal(t, blockedByDenyList, why, "CONNECT %s", hp)
		code, why = ask(t, px, http.MethodGet, "http://"+hp+"/metrics")
		require.Equal(t, http.StatusForbidden, code, "GET %s", hp)
		require.Equal(t, blockedByDenyList, why, "GET %s", hp)
	}
	s.never(t)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, refused, Refusal{Host: "127.0.0.1", Port: s.port})
	require.Contains(t, refused, Refusal{Host: "localhost", Port: s.port})
}

// TestProxyChecksNamesAfterResolving: names the proxy resolves (through
// its resolver seam) to denied addresses are refused; the connection goes
// to the address checked, the name resolved once.
func TestProxyChecksNamesAfterResolving(t *testing.T) {
	s := newSentinel(t)
	var lookups atomic.Int32
	answers := map[string][]string{
		"rebind.example":   {"127.0.0.1"},
		"mapped.example":   {"::ffff:127.0.0.1"},
		"metadata.example": {"169.254.169.254"},
		"private.example":  {"10.0.0.1", "127.0.0.1"},
		"nat64.example":    {"64:ff9b::7f00:1"},
	}
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		var out []netip.Addr
		for _, a := range answers[host] {
			out = append(out, netip.MustParseAddr(a))
		}
		if out == nil {
			return nil, errors.New("no such host")
		}
		return out, nil
	}
	var entries []string
	for name := range answers {
		entries = append(entries, name+":"+strconv.Itoa(s.port))
	}
	raw, _ := json.Marshal(map[string][]string{"allow": entries})
	policy, err := Parse(raw)
	require.NoError(t, err)
	px := proxyServer(t, &Proxy{Policy: policy, LookupIP: lookup})
	n := int32(0)
	for name := range answers {
		hp := name + ":" + strconv.Itoa(s.port)
		code, why := ask(t, px, http.MethodConnect, hp)
		require.Equal(t, http.StatusForbidden, code, hp)
		require.Equal(t, blockedByDenyList, why, hp)
		code, why = ask(t, px, http.MethodGet, "http://"+hp+"/")
		require.Equal(t, http.StatusForbidden, code, hp)
		require.Equal(t, blockedByDenyList, why, hp)
		n += 2
		require.Equal(t, n, lookups.Load(), "one resolution per request")
	}
	// The real resolver: localhost is loopback.
	px = proxyServer(t, &Proxy{Policy: policy})
	code, _ := ask(t, px, http.MethodConnect, "localhost:"+strconv.Itoa(s.port))
	require.Equal(t, http.StatusForbidden, code, "localhost is not on the list here")
	s.never(t)
}

// TestOperatorAllowedRangeIsReached: --egress-allow-private lets a job
// reach the ranges it names, in any spelling, and nothing more.
func TestOperatorAllowedRangeIsReached(t *testing.T) {
	_, port := upstream(t)
	deny, err := ParseAllow(" 127.0.0.0/8 ")
	require.NoError(t, err)
	ps := strconv.Itoa(port)
	u, _ := proxyFor(t, `{"allow":["0x7f.1:`+ps+`","localhost:`+ps+`","[::1]:`+ps+`","[::ffff:127.0.0.1]:`+ps+`"]}`, deny)
	for _, h := range []string{"0x7f.1", "127.0.0.1", "2130706433", "localhost"} {
		code, why := ask(t, u.Host, http.MethodGet, "http://"+h+":"+ps+"/x")
		require.Equal(t, http.StatusOK, code, h)
		require.Empty(t, why, h)
	}
	code, why := ask(t, u.Host, http.MethodConnect, "[::1]:"+ps)
	require.Equal(t, http.StatusForbidden, code, "::1 is not in 127.0.0.0/8")
	require.Equal(t, blockedByDenyList, why)
	resp, err := client(u).Get("http://0x7f.1:" + ps + "/y")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestDenied(t *testing.T) {
	for ip, kind := range map[string]string{
		"127.0.0.1": "loopback", "127.255.0.9": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
		"10.1.2.3": "private", "172.16.0.1": "private", "172.31.255.255": "private", "192.168.1.1": "private",
		"fd12::1": "private (unique local)", "169.254.169.254": "cloud metadata", "fd00:ec2::254": "cloud metadata",
		"::ffff:169.254.169.254": "cloud metadata", "169.254.1.1": "link-local", "fe80::1": "link-local",
		"0.0.0.0": "unspecified", "0.1.2.3": "unspecified", "::": "unspecified", "100.64.0.1": "shared (carrier-grade NAT)",
		"224.0.0.1": "multicast", "ff02::1": "multicast", "255.255.255.255": "reserved (and broadcast)",
		"64:ff9b::7f00:1": "loopback (embedded in 64:ff9b::7f00:1)", "2002:a9fe:a9fe::1": "cloud metadata (embedded in 2002:a9fe:a9fe::1)",
		"::127.0.0.1": "IPv4-compatible", "93.184.215.14": "", "2606:4700::1111": "", "172.32.0.1": "", "100.128.0.1": "",
		"64:ff9b::808:808": "",
	} {
		require.Equal(t, kind, Deny{}.Denied(netip.MustParseAddr(ip)), ip)
	}
	d, err := ParseAllow("10.0.0.0/8, 169.254.169.254,::ffff:192.168.0.0/112,fe80::/10")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.0/8,169.254.169.254/32,192.168.0.0/16,fe80::/10", d.String())
	for _, ip := range []string{"10.9.9.9", "169.254.169.254", "::ffff:10.0.0.1", "192.168.3.4", "fe80::2"} {
		require.Empty(t, d.Denied(netip.MustParseAddr(ip)), ip)
	}
	require.Equal(t, "loopback", d.Denied(netip.MustParseAddr("127.0.0.1")))
	require.Equal(t, "link-local", d.Denied(netip.MustParseAddr("169.254.1.1")))
	for _, bad := range []string{"10.0.0.0/33", "localhost", "0x7f.1", "fe80::1%eth0", "10/8"} {
		_, err := ParseAllow(bad)
		require.ErrorContains(t, err, AllowFlag, bad)
	}
}

// TestForJobRefusesDeniedEntries: a job naming a denied address, however
// written, fails at validation with the entry's field named, unless the
// operator allowed its range.
func TestForJobRefusesDeniedEntries(t *testing.T) {
	denied := append([]string{"10.0.0.7", "169.254.169.254", "0xa9.0xfe.0xa9.0xfe", "[fd00:ec2::254]", "[::ffff:169.254.169.254]",
		"metadata.google.internal", "Metadata.Google.Internal.", "100.64.1.1", "[fe80::1]", "224.0.0.1", "255.255.255.255",
		"*.localhost", "api.localhost:8080", "[64:ff9b::a00:1]"}, loopbackSpellings...)
	for _, e := range denied {
		raw, _ := json.Marshal(map[string][]string{"allow": {"github.com", e + ":9090"}})
		if strings.HasPrefix(e, "*.") || strings.Contains(e, ":8080") {
			raw, _ = json.Marshal(map[string][]string{"allow": {"github.com", e}})
		}
		_, err := ForJob(raw, Policy{}, Allow, Deny{})
		var de *DeniedError
		require.ErrorAs(t, err, &de, e)
		require.Equal(t, "network.allow[1]", de.Field, e)
		require.True(t, IsNotAllowed(err), e)
		require.Contains(t, err.Error(), "network.allow[1]")
		require.Contains(t, err.Error(), AllowFlag)
	}
	for _, e := range []string{"github.com", "93.184.215.14", "[2606:4700::1111]", "*.npmjs.org", "metadata.example.com"} {
		raw, _ := json.Marshal(map[string][]string{"allow": {e}})
		_, err := ForJob(raw, Policy{}, Allow, Deny{})
		require.NoError(t, err, e)
	}
	allow, err := ParseAllow("127.0.0.0/8,::1,10.0.0.0/8")
	require.NoError(t, err)
	for _, e := range []string{"localhost:9090", "0x7f.1:9090", "[::1]:9090", "10.0.0.7", "2130706433"} {
		raw, _ := json.Marshal(map[string][]string{"allow": {e}})
		_, err := ForJob(raw, Policy{}, Allow, allow)
		require.NoError(t, err, e)
	}
	_, err = ForJob([]byte(`{"allow":["169.254.169.254"]}`), Policy{}, Allow, allow)
	require.ErrorContains(t, err, "cloud metadata")
}

func TestParseHost(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1": "127.0.0.1", "2130706433": "127.0.0.1", "0177.0.0.1": "127.0.0.1", "0x7f.1": "127.0.0.1",
		"127.1": "127.0.0.1", "0x7F000001": "127.0.0.1", "127.0.0.1.": "127.0.0.1", "0": "0.0.0.0", "0x": "0.0.0.0",
		"10.0.258": "10.0.1.2", "0xa9.0xfe.0xa9.0xfe": "169.254.169.254", "4294967295": "255.255.255.255",
		"[::ffff:127.0.0.1]": "127.0.0.1", "::1": "::1", "[::1]": "::1", "[FD00:EC2::254]": "fd00:ec2::254",
		"GitHub.COM.": "name github.com", "localhost": "name localhost", "xn--bcher-kva.example": "name xn--bcher-kva.example",
		"1.2.3.4.5": "", "4294967296": "", "256.1.1.1": "", "1.2.3.0x100": "1.2.3.0x100?", "09.1.1.1": "", "0x1g.1": "name?",
		"foo.123": "", "foo.0x1": "", "a..b": "", "": "", "[127.0.0.1]": "", "[fe80::1%eth0]": "", "fe80::1%25eth0": "",
		"[::1": "", "a b": "", "%31%32%37.0.0.1": "", "127.0.0.1..": "",
	} {
		ip, name, err := parseHost(in)
		switch {
		case want == "1.2.3.0x100?", want == "":
			require.Error(t, err, "%q gave %v %q", in, ip, name)
		case want == "name?":
			require.Error(t, err, in)
		case strings.HasPrefix(want, "name "):
			require.NoError(t, err, in)
			require.False(t, ip.IsValid(), in)
			require.Equal(t, strings.TrimPrefix(want, "name "), name, in)
		default:
			require.NoError(t, err, in)
			require.Equal(t, want, ip.String(), in)
			require.Empty(t, name, in)
		}
	}
}

// FuzzParseHost: a host reads as an address or a name, never both; an
// address spells itself back; a name is a valid DNS name that no resolver
// takes for an address; and the deny-list judges an address and its
// IPv4-mapped form alike.
func FuzzParseHost(f *testing.F) {
	for _, s := range append([]string{"github.com", "a.b.c", "1.2.3.4.5", "0x", "fe80::1%eth0", "[::1", "foo.0x1"}, loopbackSpellings...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		ip, name, err := parseHost(h)
		if err != nil {
			if ip.IsValid() || name != "" {
				t.Fatalf("%q: error %v with a result", h, err)
			}
			return
		}
		if ip.IsValid() == (name != "") {
			t.Fatalf("%q: address %v and name %q", h, ip, name)
		}
		if ip.IsValid() {
			if ip.Is4In6() || ip.Zone() != "" {
				t.Fatalf("%q: %v is mapped or zoned", h, ip)
			}
			back, n2, err := parseHost(ip.String())
			if err != nil || back != ip || n2 != "" {
				t.Fatalf("%q: %v does not spell itself back (%v %q %v)", h, ip, back, n2, err)
			}
			if ip.Is4() {
				mapped := netip.AddrFrom16(ip.As16())
				if (Deny{}).Denied(ip) != (Deny{}).Denied(mapped) {
					t.Fatalf("%v and %v are judged apart", ip, mapped)
				}
			}
			return
		}
		if checkName(name) != nil || net.ParseIP(name) != nil {
			t.Fatalf("%q: name %q is not a DNS name", h, name)
		}
		labels := strings.Split(name, ".")
		if isNumber(labels[len(labels)-1]) {
			t.Fatalf("%q: name %q ends in a number", h, name)
		}
		if u, err := url.Parse("http://" + name + "/"); err != nil || u.Hostname() != name {
			t.Fatalf("%q: name %q does not survive a URL", h, name)
		}
	})
}
