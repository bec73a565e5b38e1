package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// Unbound tokens are for warm agents (docs/warm.md): an agent started before
// anyone knows which run it will serve gets a token with its environment,
// and the token becomes a run's only when a job takes the agent.

// ErrNotUnbound is a Bind of a token that OpenUnbound did not issue, or
// that was bound or revoked already.
var ErrNotUnbound = errors.New("gateway: the token is not an unbound token of this gateway")

// OpenUnbound issues a token that belongs to no run: requests with it get
// 401 (never forwarded, never metered) until Bind makes it a run's.
func (g *Gateway) OpenUnbound() (token, baseURL string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	token = TokenPrefix + hex.EncodeToString(b[:])
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unbound == nil {
		g.unbound = map[[32]byte]bool{}
	}
	g.unbound[sha256.Sum256([]byte(token))] = true
	return token, g.url
}

// Bind makes an unbound token the token of the run info describes, as
// Open would have issued it: from then on its requests are forwarded,
// metered and capped as the run's, and Close ends it.
func (g *Gateway) Bind(token string, info RunInfo) error {
	key := sha256.Sum256([]byte(token))
	if info.FirstCall < 1 {
		info.FirstCall = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.unbound[key] {
		cancel()
		return ErrNotUnbound
	}
	delete(g.unbound, key)
	if g.stopped {
		cancel()
	}
	g.runs[key] = &run{info: info, ctx: ctx, cancel: cancel}
	return nil
}

// Revoke ends a token whatever it is: an unbound one is forgotten, a bound
// one is closed (Close, whose Summary it returns).
func (g *Gateway) Revoke(token string) Summary {
	key := sha256.Sum256([]byte(token))
	g.mu.Lock()
	wasUnbound := g.unbound[key]
	delete(g.unbound, key)
	g.mu.Unlock()
	if wasUnbound {
		return Summary{}
	}
	return g.Close(token)
}
