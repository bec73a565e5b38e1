package sandboxtest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// try runs one escape probe of the child (try-* steps) and says what
// happened, on one line.
func try(cmd, arg string) string {
	switch cmd {
	case "try-read":
		b, err := os.ReadFile(arg)
		if err != nil {
			return "err " + err.Error()
		}
		return "ok " + strings.TrimSpace(string(b))
	case "try-write":
		if err := os.WriteFile(arg, []byte("escaped"), 0o644); err != nil {
			return "err " + err.Error()
		}
		return "ok"
	case "try-signal":
		pid, err := strconv.Atoi(arg)
		if err == nil {
			err = syscall.Kill(pid, syscall.SIGTERM)
		}
		if err != nil {
			return "err " + err.Error()
		}
		return "ok"
	case "try-dial":
		c, err := net.DialTimeout("tcp", arg, 5*time.Second)
		if err != nil {
			return "err " + err.Error()
		}
		_ = c.Close()
		return "ok"
	case "try-userns":
		// A user namespace of its own (util-linux unshare).
		out, err := exec.Command("unshare", "--user", "true").CombinedOutput()
		if err != nil {
			return "err " + err.Error() + ": " + strings.TrimSpace(string(out))
		}
		return "ok"
	case "try-get":
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: envProxy}}
		resp, err := c.Get(arg)
		if err != nil {
			return "err " + err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Sprintf("ok %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return "err unknown probe " + cmd
}

// envProxy proxies as curl and Node do: through HTTP_PROXY unless NO_PROXY
// names the host, loopback names included (Go's own ProxyFromEnvironment
// never proxies localhost).
func envProxy(r *http.Request) (*url.URL, error) {
	p := os.Getenv("HTTP_PROXY")
	if p == "" {
		return nil, nil
	}
	for _, h := range strings.Split(os.Getenv("NO_PROXY"), ",") {
		if strings.TrimSpace(h) == r.URL.Hostname() {
			return nil, nil
		}
	}
	return url.Parse(p)
}
