package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loopbackAllowed is a deny-list whose operator allows loopback, where
// these tests' servers listen.
var loopbackAllowed, _ = ParseAllow("127.0.0.0/8,::1")

// proxyFor serves a Proxy for policy and deny on a loopback listener and
// returns its URL and the refusals it reported.
func proxyFor(t *testing.T, policy string, deny Deny) (*url.URL, func() []Refusal) {
	t.Helper()
	p, err := Parse([]byte(policy))
	require.NoError(t, err)
	var mu sync.Mutex
	var refused []Refusal
	px := &Proxy{Policy: p, Deny: deny, OnRefused: func(r Refusal) {
		mu.Lock()
		refused = append(refused, r)
		mu.Unlock()
	}}
	srv := httptest.NewServer(px)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u, func() []Refusal {
		mu.Lock()
		defer mu.Unlock()
		return append([]Refusal(nil), refused...)
	}
}

func upstream(t *testing.T) (*httptest.Server, int) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "hello %s proxy-auth=%q", r.URL.Path, r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(up.Close)
	_, ps, _ := net.SplitHostPort(up.Listener.Addr().String())
	port, _ := strconv.Atoi(ps)
	return up, port
}

func client(proxy *url.URL) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyHTTPAdmitsListedHostOnly(t *testing.T) {
	_, port := upstream(t)
	px, refused := proxyFor(t, fmt.Sprintf(`{"allow":["localhost:%d"]}`, port), loopbackAllowed)
	c := client(px)

	code, body := get(t, c, fmt.Sprintf("http://localhost:%d/x", port))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, `hello /x proxy-auth=""`, body, "Proxy-* headers are not forwarded")

	// The same server by IP literal is not what the entry names.
	code, _ = get(t, c, fmt.Sprintf("http://127.0.0.1:%d/x", port))
	require.Equal(t, http.StatusForbidden, code)
	code, _ = get(t, c, fmt.Sprintf("http://127.0.0.1:%d/y", port))
	require.Equal(t, http.StatusForbidden, code)
	code, _ = get(t, c, "http://localhost:1/")
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, []Refusal{{Host: "127.0.0.1", Port: port}, {Host: "localhost", Port: 1}}, refused(),
		"each refused (host, port) is reported once")
}

func TestProxyConnectTunnels(t *testing.T) {
	_, port := upstream(t)
	px, refused := proxyFor(t, fmt.Sprintf(`{"allow":["127.0.0.1:%d"]}`, port), loopbackAllowed)

	conn, err := net.Dial("tcp", px.Host)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\nGET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", port, port)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, `hello /t proxy-auth=""`, string(b), "the bytes sent right behind CONNECT went through the tunnel")
	require.Empty(t, refused())

	conn2, err := net.Dial("tcp", px.Host)
	require.NoError(t, err)
	defer conn2.Close()
	_, err = fmt.Fprintf(conn2, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
	require.NoError(t, err)
	resp, err = http.ReadResponse(bufio.NewReader(conn2), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, "blocked-by-allowlist", resp.Header.Get("X-Proxy-Error"))
	require.Equal(t, []Refusal{{Host: "example.com", Port: 443}}, refused())
}

func TestProxyDialChecksAfterResolving(t *testing.T) {
	// A name that resolves (or is rebound) to loopback: the address is
	// refused after resolution, unless the operator allowed the range.
	_, port := upstream(t)
	addr := "localhost:" + strconv.Itoa(port)
	p := &Proxy{}
	_, err := p.dial(context.Background(), "tcp", addr)
	var de *deniedError
	require.ErrorAs(t, err, &de)
	p = &Proxy{Deny: loopbackAllowed}
	conn, err := p.dial(context.Background(), "tcp", addr)
	require.NoError(t, err, "an allowed range is reached")
	require.NoError(t, conn.Close())
}

func TestProxyRejectsOriginForm(t *testing.T) {
	px, _ := proxyFor(t, `"open"`, Deny{})
	resp, err := http.Get("http://" + px.Host + "/direct")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}
