package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
)

// ErrPrivate is wrapped when a URL points at a loopback, private,
// link-local or unspecified address and private receivers are not allowed.
var ErrPrivate = errors.New("the address is loopback, private or link-local (dispatcher serve --webhook-allow-private allows it)")

// maxURLBytes bounds an endpoint's URL.
const maxURLBytes = 2048

// private reports whether ip is one a receiver may not be on by default.
func private(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast() ||
		// 100.64.0.0/10 (carrier-grade NAT) is as private as 10/8.
		netip.MustParsePrefix("100.64.0.0/10").Contains(ip)
}

// CheckURL checks an endpoint's URL: http or https, a host, and unless
// allowPrivate, a host that is not (and does not resolve to) a private
// address. lookup resolves names (nil: the system resolver).
func CheckURL(ctx context.Context, raw string, allowPrivate bool, lookup func(ctx context.Context, host string) ([]netip.Addr, error)) error {
	if len(raw) > maxURLBytes {
		return fmt.Errorf("url: at most %d bytes", maxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("url %q: must be http:// or https://", raw)
	}
	if u.Hostname() == "" || u.User != nil {
		return fmt.Errorf("url %q: needs a host and no user:password", raw)
	}
	if allowPrivate {
		return nil
	}
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		addrs = []netip.Addr{ip}
	} else if addrs, err = lookup(ctx, u.Hostname()); err != nil {
		return fmt.Errorf("url %q: resolving %s: %w", raw, u.Hostname(), err)
	}
	for _, ip := range addrs {
		if private(ip) {
			return fmt.Errorf("url %q: %s is %s: %w", raw, u.Hostname(), ip, ErrPrivate)
		}
	}
	return nil
}

// dialControl refuses connections to private addresses at connect time
// (a name may resolve differently than when it was added).
func dialControl(allowPrivate bool) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if private(ap.Addr()) {
			return fmt.Errorf("connecting to %s: %w", ap.Addr(), ErrPrivate)
		}
		return nil
	}
}
