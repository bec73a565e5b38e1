package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/pkg/sandbox/egress"
)

// netServices are the listeners the worker opened in one sandbox's network
// namespace (nothing of them runs inside) and the connections they carry.
type netServices struct {
	lns   []net.Listener
	proxy *http.Server
	wg    sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

// serveNetwork opens the forwards, and with egress.Allow the proxy, on
// 127.0.0.1 inside the network namespace of process pid.
func serveNetwork(pid int, n *Network, log zerolog.Logger) (*netServices, error) {
	svc := &netServices{conns: map[net.Conn]bool{}}
	for _, f := range n.Forwards {
		ln, err := listenInNetns(pid, f.Port)
		if err != nil {
			svc.close()
			return nil, err
		}
		svc.lns = append(svc.lns, ln)
		svc.wg.Add(1)
		go svc.forward(ln, f.To)
	}
	if n.Policy.Mode == egress.Allow {
		ln, err := listenInNetns(pid, ProxyPort)
		if err != nil {
			svc.close()
			return nil, err
		}
		svc.lns = append(svc.lns, ln)
		svc.proxy = &http.Server{
			Handler:           &egress.Proxy{Policy: n.Policy, Deny: n.Deny, OnRefused: n.OnRefused},
			ReadHeaderTimeout: 30 * time.Second,
		}
		svc.wg.Add(1)
		go func() {
			defer svc.wg.Done()
			if err := svc.proxy.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Debug().Err(err).Msg("egress proxy stopped")
			}
		}()
	}
	return svc, nil
}

// forward accepts connections made inside to ln and joins each to a new
// connection to addr made from the worker's namespace.
func (svc *netServices) forward(ln net.Listener, addr string) {
	defer svc.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !svc.track(c) {
			_ = c.Close()
			return
		}
		svc.wg.Add(1)
		go func() {
			defer svc.wg.Done()
			defer svc.untrack(c)
			up, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				_ = c.Close()
				return
			}
			if !svc.track(up) {
				_ = up.Close()
				_ = c.Close()
				return
			}
			defer svc.untrack(up)
			egress.Pipe(c, c, up)
		}()
	}
}

func (svc *netServices) track(c net.Conn) bool {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.closed {
		return false
	}
	svc.conns[c] = true
	return true
}

func (svc *netServices) untrack(c net.Conn) {
	svc.mu.Lock()
	delete(svc.conns, c)
	svc.mu.Unlock()
}

// close stops accepting, ends every connection and waits for the
// goroutines. The listeners pin the namespace until then.
func (svc *netServices) close() {
	svc.mu.Lock()
	svc.closed = true
	for c := range svc.conns {
		_ = c.Close()
	}
	svc.mu.Unlock()
	for _, ln := range svc.lns {
		_ = ln.Close()
	}
	if svc.proxy != nil {
		_ = svc.proxy.Close()
	}
	svc.wg.Wait()
}

// listenInNetns opens a TCP listener on 127.0.0.1:port inside the network
// namespace of pid, from a thread that enters it and comes back. The
// address is bound with IP_FREEBIND: bwrap may not have brought up the
// namespace's loopback yet.
func listenInNetns(pid, port int) (net.Listener, error) {
	type res struct {
		ln  net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// A thread that cannot return to the worker's namespace is left
		// locked, so the runtime ends it rather than reuse it.
		runtime.LockOSThread()
		ln, back, err := listenIn(pid, port)
		if back {
			runtime.UnlockOSThread()
		}
		ch <- res{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

func listenIn(pid, port int) (ln net.Listener, back bool, err error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer self.Close()
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, true, fmt.Errorf("open the sandbox's network namespace: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("enter the sandbox's network namespace: %w", err)
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err = lc.Listen(context.Background(), "tcp4", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		err = fmt.Errorf("listen on 127.0.0.1:%d in the sandbox: %w", port, err)
	}
	back = unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil
	return ln, back, err
}
