package bridgefake

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// startGitEgress emulates the bridge Worker's git egress handler: an HTTP
// forward proxy on loopback, given to every process as http_proxy, that
// drops any Authorization the process sent and adds the Basic auth of the
// matching credential-store entry, the way the Worker does for containers.
// The secret lives in the fake (the "Worker"), never in a process's
// environment or files.
func startGitEgress(tb testing.TB, creds workspace.Credentials) string {
	tb.Helper()
	transport := &http.Transport{Proxy: nil}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect || r.URL.Host == "" {
			http.Error(w, "bridgefake egress: plain http forward proxy only", http.StatusMethodNotAllowed)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Header.Del("Authorization")
		out.Header.Del("Proxy-Authorization")
		if auth, ok := creds.Authorization(r.URL.String()); ok {
			out.Header.Set("Authorization", auth)
		}
		resp, err := transport.RoundTrip(out)
		if err != nil {
			http.Error(w, "bridgefake egress: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			if strings.EqualFold(k, "WWW-Authenticate") {
				continue // the container never learns how to authenticate itself
			}
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("bridgefake egress: %v", err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() {
		_ = srv.Close()
		transport.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String()
}
