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
// literal ("10.0.0.7", "[::1]"), each with an optional ":port". Without a
// port an entry admits ports 80 and 443. Names are compared lower-cased
// without a trailing dot. An IP-literal request matches only an IP-literal
// entry: "127.0.0.1:8080" is not admitted by "localhost:8080".
//
// # Addresses
//
// The proxy resolves a name itself and checks every address it is about to
// connect to, just before connect(2), so a name that resolves (or is
// rebound) to a loopback, private, link-local, unspecified or multicast
// address is refused unless the entry names it: an IP-literal entry, or the
// name "localhost". The sandbox needs no DNS: it names hosts in its requests.
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
