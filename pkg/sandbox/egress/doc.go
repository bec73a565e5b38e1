// Package egress decides and enforces what a contained sandbox may reach on
// the network (docs/contained.md): the job field `network` ("none", "open" or
// {"allow":[…]}) decoded into a Policy, the worker's --network-max cap
// (CheckMax), and Proxy, the HTTP and CONNECT proxy the worker serves inside
// each sandbox's network namespace, which admits only the hosts and ports
// the policy lists and reports each refused (host, port) once.
//
// # Matching
//
// An allow entry is a host name ("github.com"), a suffix ("*.npmjs.org",
// matching any name below npmjs.org but not npmjs.org itself), or an IP
// address ("10.0.0.7", "[::1]"), each with an optional ":port". Without a
// port an entry admits ports 80 and 443. Names are compared lower-cased
// without a trailing dot. An address is read in every spelling inet_aton
// and URL parsers accept ("2130706433", "0177.0.0.1", "0x7f.1", "127.1",
// "[::ffff:127.0.0.1]") and compared as the address it is; a host that
// ends in a number but is no address is refused. An address request
// matches only an address entry: "127.0.0.1:8080" is not admitted by
// "localhost:8080".
//
// # The deny-list
//
// Deny refuses, whatever the allow list says, the addresses of
// DeniedRanges: loopback, private, link-local, cloud metadata,
// unspecified, shared (CGNAT), multicast, reserved; an IPv4-mapped
// address as its IPv4 address, and the IPv4 address inside a NAT64 or
// 6to4 one too. The operator allows ranges with ParseAllow
// (--egress-allow-private). ForJob refuses an entry naming a denied
// address (or a name that stands for one: "localhost",
// "metadata.google.internal") with a *DeniedError naming the entry. The
// proxy checks an address literal before dialing, and resolves a name
// itself (Proxy.LookupIP), checks every address and connects to the
// checked address (no second resolution, so DNS rebinding gets nowhere),
// checking it once more just before connect(2). The sandbox needs no
// DNS: it names hosts in its requests.
//
// # Why net/http and not a proxy library
//
// The proxy is net/http alone: CONNECT is a hijacked connection copied both
// ways, plain HTTP an httputil.ReverseProxy with no upstream proxy. The
// well-kept library, elazarl/goproxy, is mostly MITM, HTTP/2 and websocket
// code agentfleet does not need, and its defaults are the wrong way round
// for a guard (an upstream TLS transport that skips verification, dialing
// through the environment's proxy, CONNECT accepted unless a handler
// rejects it). An allow-list proxy is a small amount of code whose every
// line is the policy, so it is kept here where it can be read whole.
package egress
