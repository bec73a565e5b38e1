package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Refusal is one refused (host, port), as published on `.egress`.
type Refusal struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	// Allowed is always false: allowed connections are not reported.
	Allowed bool `json:"allowed"`
}

// Proxy is the HTTP forward proxy of one sandbox: absolute-URI requests and
// CONNECT tunnels to what Policy admits and Deny does not refuse. Serve it
// on a listener inside the sandbox's network namespace; it dials from the
// worker's.
type Proxy struct {
	// Policy decides; only Mode Allow and Open admit anything.
	Policy Policy
	// Deny refuses addresses whatever Policy admits: an IP literal at once,
	// a name after the proxy resolved it (the connection goes to the
	// address checked, never resolved again). The zero value refuses every
	// range of DeniedRanges.
	Deny Deny
	// LookupIP resolves a name. nil: net.DefaultResolver.LookupNetIP.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// OnRefused, if set, is called once per refused (host, port), from the
	// request's goroutine. It must not block for long.
	OnRefused func(Refusal)
	// DialTimeout bounds a connect. Defaults to 10s.
	DialTimeout time.Duration

	mu      sync.Mutex
	refused map[Refusal]bool
	rp      *httputil.ReverseProxy
	once    sync.Once
}

// deniedError is an address the deny-list refuses.
type deniedError struct {
	host string
	addr netip.Addr
	kind string
}

func (e *deniedError) Error() string {
	if e.host == e.addr.String() {
		return fmt.Sprintf("%s is on this worker's egress deny-list (%s)", e.addr, e.kind)
	}
	return fmt.Sprintf("%s resolves to %s, which is on this worker's egress deny-list (%s)", e.host, e.addr, e.kind)
}

// Header values of X-Proxy-Error.
const (
	blockedByAllowList = "blocked-by-allowlist"
	blockedByDenyList  = "blocked-by-denylist"
)

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, port, ok := target(r)
	if !ok {
		http.Error(w, "egress proxy: only absolute http:// requests and CONNECT host:port are proxied", http.StatusBadRequest)
		return
	}
	ip, host, err := parseHost(raw)
	if err != nil {
		http.Error(w, "egress proxy: "+err.Error(), http.StatusBadRequest)
		return
	}
	if ip.IsValid() {
		host = ip.String()
	}
	if _, ok := p.Policy.Admits(host, port); !ok {
		p.refuse(w, host, port, blockedByAllowList,
			fmt.Sprintf("%s is not on this job's network allow list", net.JoinHostPort(host, strconv.Itoa(port))))
		return
	}
	if ip.IsValid() {
		if kind := p.Deny.Denied(ip); kind != "" {
			p.refuse(w, host, port, blockedByDenyList, (&deniedError{host: host, addr: ip, kind: kind}).Error())
			return
		}
	}
	if r.Method == http.MethodConnect {
		p.tunnel(r.Context(), w, host, port)
		return
	}
	p.once.Do(p.init)
	// The request goes to the host as read here, whatever its spelling.
	r.URL.Host = net.JoinHostPort(host, strconv.Itoa(port))
	p.rp.ServeHTTP(w, r)
}

// target is the host (as spelled, lower-cased, without brackets) and port
// a request asks for.
func target(r *http.Request) (string, int, bool) {
	hostport := r.Host
	def := 443
	if r.Method != http.MethodConnect {
		if r.URL == nil || r.URL.Scheme != "http" || r.URL.Host == "" {
			return "", 0, false
		}
		hostport, def = r.URL.Host, 80
	}
	h, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		if r.Method == http.MethodConnect {
			return "", 0, false
		}
		h, ps = strings.Trim(hostport, "[]"), strconv.Itoa(def)
	}
	n, err := strconv.Atoi(ps)
	if err != nil || n < 1 || n > 65535 || h == "" {
		return "", 0, false
	}
	return strings.ToLower(h), n, true
}

// refuse answers 403 and reports (host, port) the first time.
func (p *Proxy) refuse(w http.ResponseWriter, host string, port int, why, msg string) {
	ref := Refusal{Host: host, Port: port}
	p.mu.Lock()
	if p.refused == nil {
		p.refused = make(map[Refusal]bool)
	}
	first := !p.refused[ref]
	p.refused[ref] = true
	p.mu.Unlock()
	if first && p.OnRefused != nil {
		p.OnRefused(ref)
	}
	w.Header().Set("X-Proxy-Error", why)
	http.Error(w, "egress proxy: "+msg, http.StatusForbidden)
}

func (p *Proxy) init() {
	tr := &http.Transport{
		Proxy:                 nil, // never through the worker's own proxy settings
		DialContext:           p.dial,
		ForceAttemptHTTP2:     false,
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // streaming answers may take long
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.URL
			pr.Out.Host = pr.In.Host
			for k := range pr.Out.Header {
				if strings.HasPrefix(strings.ToLower(k), "proxy-") {
					pr.Out.Header.Del(k)
				}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var de *deniedError
			if errors.As(err, &de) {
				port, _ := strconv.Atoi(r.URL.Port())
				p.refuse(w, r.URL.Hostname(), port, blockedByDenyList, de.Error())
				return
			}
			http.Error(w, "egress proxy: "+err.Error(), http.StatusBadGateway)
		},
	}
}

// tunnel answers CONNECT: dial, 200, copy both ways.
func (p *Proxy) tunnel(ctx context.Context, w http.ResponseWriter, host string, port int) {
	up, err := p.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		var de *deniedError
		if errors.As(err, &de) {
			p.refuse(w, host, port, blockedByDenyList, de.Error())
			return
		}
		http.Error(w, "egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = up.Close()
		http.Error(w, "egress proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		_ = conn.Close()
		_ = up.Close()
		return
	}
	Pipe(conn, brw.Reader, up)
}

// Pipe copies a and b both ways (reading a through ra, which may hold bytes
// already buffered) until either side ends, then closes both.
func Pipe(a net.Conn, ra io.Reader, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst net.Conn, src io.Reader) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
		done <- struct{}{}
	}
	go cp(b, ra)
	go cp(a, b)
	<-done
	<-done
	_ = a.Close()
	_ = b.Close()
}

// dial connects from the worker's network namespace to addr: a name is
// resolved here, every address checked against the deny-list, and the
// connection made to a checked address itself (no second resolution, so
// DNS rebinding gets nowhere). The address is checked once more just
// before connect(2).
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip, name, err := parseHost(h)
	if err != nil {
		return nil, err
	}
	addrs := []netip.Addr{ip}
	if !ip.IsValid() {
		lookup := p.LookupIP
		if lookup == nil {
			lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			}
		}
		if addrs, err = lookup(ctx, name); err != nil {
			return nil, err
		}
	}
	timeout := p.DialTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	d := &net.Dialer{Timeout: timeout, Control: func(_, a string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return err
		}
		if kind := p.Deny.Denied(ap.Addr()); kind != "" {
			return &deniedError{host: h, addr: ap.Addr().Unmap(), kind: kind}
		}
		return nil
	}}
	var denied, last error
	for _, a := range addrs {
		a = a.WithZone("").Unmap()
		if kind := p.Deny.Denied(a); kind != "" {
			if denied == nil {
				denied = &deniedError{host: h, addr: a, kind: kind}
			}
			continue
		}
		conn, err := d.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return conn, nil
		}
		last = err
	}
	switch {
	case last != nil:
		return nil, last
	case denied != nil:
		return nil, denied
	}
	return nil, fmt.Errorf("%s has no address", h)
}
