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
// CONNECT tunnels to what Policy admits. Serve it on a listener inside the
// sandbox's network namespace; it dials from the worker's.
type Proxy struct {
	// Policy decides; only Mode Allow and Open admit anything.
	Policy Policy
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

// errDenied is the dial-time refusal of a loopback or private address the
// rule did not name.
var errDenied = errors.New("egress: address not allowed")

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, port, ok := target(r)
	if !ok {
		http.Error(w, "egress proxy: only absolute http:// requests and CONNECT host:port are proxied", http.StatusBadRequest)
		return
	}
	rule, ok := p.Policy.Admits(host, port)
	if !ok {
		p.refuse(w, host, port)
		return
	}
	ctx := withRule(r.Context(), rule)
	if r.Method == http.MethodConnect {
		p.tunnel(ctx, w, host, port)
		return
	}
	p.once.Do(p.init)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// target is the host (an IP literal without brackets) and port a request
// asks for.
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
	return strings.TrimSuffix(strings.ToLower(h), "."), n, true
}

func (p *Proxy) refuse(w http.ResponseWriter, host string, port int) {
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
	w.Header().Set("X-Proxy-Error", "blocked-by-allowlist")
	http.Error(w, fmt.Sprintf("egress proxy: %s is not on this job's network allow list", net.JoinHostPort(host, strconv.Itoa(port))), http.StatusForbidden)
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
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "egress proxy: "+err.Error(), http.StatusBadGateway)
		},
	}
}

// tunnel answers CONNECT: dial, 200, copy both ways.
func (p *Proxy) tunnel(ctx context.Context, w http.ResponseWriter, host string, port int) {
	up, err := p.dial(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
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

type ruleKey struct{}

type dialRule struct {
	rule Rule
}

func withRule(ctx context.Context, r Rule) context.Context {
	return context.WithValue(ctx, ruleKey{}, dialRule{rule: r})
}

// dial connects from the worker's network namespace, refusing just before
// connect(2) an address the admitting rule did not name (see the package
// documentation).
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	dr, _ := ctx.Value(ruleKey{}).(dialRule)
	timeout := p.DialTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	d := &net.Dialer{Timeout: timeout, Control: func(_, a string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return err
		}
		if !addrAllowed(ap.Addr().Unmap(), dr) {
			return fmt.Errorf("%w: %s resolves to %s", errDenied, addr, ap.Addr())
		}
		return nil
	}}
	return d.DialContext(ctx, network, addr)
}

// addrAllowed: public addresses always; loopback, private and the rest only
// when the rule names them (an IP literal, or "localhost" for loopback).
func addrAllowed(ip netip.Addr, dr dialRule) bool {
	special := ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast()
	if !special {
		return true
	}
	switch {
	case dr.rule.IP.IsValid():
		return dr.rule.IP == ip
	case dr.rule.Host == "localhost" && !dr.rule.Suffix:
		return ip.IsLoopback()
	}
	return false
}
