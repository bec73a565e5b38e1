package sandbox

// What the bridge Worker supports (GET /v1/version), learned once per
// provider: a worker of this release refuses Cloudflare runs against a
// bridge that lacks what it uses, with one clear error, instead of failing
// each run on the first route the bridge does not have.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode"
)

// BridgeVersion is the bridge Worker (deploy/cloudflare) of this release,
// the first to answer GET /v1/version. A bridge without that route is
// older.
const BridgeVersion = "0.2.0"

// Bridge capabilities, as GET /v1/version lists them.
const (
	// BridgeCapModel: PUT/GET/DELETE /v1/sb/:id/model, the metered model
	// egress (every Cloudflare run of this worker opens one).
	BridgeCapModel = "model"
	// BridgeCapStdin: interactive stdin (POST /proc/:id/stdin and
	// /stdin/close), which sessions use.
	BridgeCapStdin = "stdin"
)

// BridgeNeeds is what a worker of this release uses of its bridge.
var BridgeNeeds = []string{BridgeCapModel, BridgeCapStdin}

// BridgeInfo is what a bridge says of itself. Version "" is a bridge from
// before the version route (older than BridgeVersion).
type BridgeInfo struct {
	Version      string   `json:"version"`
	Capabilities []string `json:"capabilities"`
}

// VersionText is the version for people: "unknown (before 0.2.0)" for a
// bridge without the route.
func (b BridgeInfo) VersionText() string {
	if b.Version == "" {
		return "unknown (before " + BridgeVersion + ")"
	}
	return b.Version
}

// Missing lists what of needs the bridge does not support.
func (b BridgeInfo) Missing(needs []string) []string {
	var out []string
	for _, n := range needs {
		if !slices.Contains(b.Capabilities, n) {
			out = append(out, n)
		}
	}
	return out
}

// BridgeIncompatibleError is a bridge this worker cannot use. It matches
// ErrInvalid (retrying will not help): the bridge must be upgraded.
type BridgeIncompatibleError struct {
	// Bridge is the bridge's version (VersionText), Worker this worker's.
	Bridge, Worker string
	// Missing is what the worker needs and the bridge lacks.
	Missing []string
}

func (e *BridgeIncompatibleError) Error() string {
	return fmt.Sprintf("the Cloudflare bridge Worker is version %s and this worker is version %s: the bridge lacks %s; "+
		"deploy the bridge of the worker's release (deploy/cloudflare, version %s or later)",
		e.Bridge, e.Worker, strings.Join(e.Missing, ", "), BridgeVersion)
}

// Is reports that a BridgeIncompatibleError is an ErrInvalid.
func (e *BridgeIncompatibleError) Is(target error) bool { return target == ErrInvalid }

// maxBridgeInfoBytes bounds the answer of GET /v1/version.
const maxBridgeInfoBytes = 16 << 10

// DecodeBridgeInfo decodes a GET /v1/version answer: a version of 1 to
// 64 printable characters and at most 64 capabilities of the same kind.
// Fields a newer bridge adds are ignored.
func DecodeBridgeInfo(b []byte) (BridgeInfo, error) {
	var info BridgeInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return BridgeInfo{}, fmt.Errorf("%w: the bridge's version answer: %w", ErrInvalid, err)
	}
	if !bridgeWord(info.Version) {
		return BridgeInfo{}, fmt.Errorf("%w: the bridge's version answer: version must be 1 to 64 printable characters", ErrInvalid)
	}
	if len(info.Capabilities) > 64 || slices.ContainsFunc(info.Capabilities, func(c string) bool { return !bridgeWord(c) }) {
		return BridgeInfo{}, fmt.Errorf("%w: the bridge's version answer: at most 64 capabilities of 1 to 64 printable characters", ErrInvalid)
	}
	return info, nil
}

func bridgeWord(s string) bool {
	return s != "" && len(s) <= 64 && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' })
}

// Bridge returns what the bridge supports, asking it once (GET
// /v1/version; a 404 is a bridge from before the route) and keeping the
// answer for the provider's life. A bridge that cannot be reached is asked
// again next time (the error wraps ErrUnavailable).
func (c *Cloudflare) Bridge(ctx context.Context) (BridgeInfo, error) {
	select {
	case c.bridgeLock <- struct{}{}:
	case <-ctx.Done():
		return BridgeInfo{}, fmt.Errorf("cloudflare: the bridge's version: %w", ctx.Err())
	}
	defer func() { <-c.bridgeLock }()
	if c.bridge != nil {
		return *c.bridge, nil
	}
	var info BridgeInfo
	err := c.retry(ctx, func(ctx context.Context) error {
		status, b, err := c.send(ctx, http.MethodGet, "/v1/version", nil, "", nil, maxBridgeInfoBytes)
		if status == http.StatusNotFound {
			info = BridgeInfo{}
			return nil
		}
		if err != nil {
			return err
		}
		info, err = DecodeBridgeInfo(b)
		return err
	})
	if err != nil {
		return BridgeInfo{}, fmt.Errorf("cloudflare: the bridge's version: %w", err)
	}
	c.bridge = &info
	c.log.Info().Str("bridge_version", info.VersionText()).Strs("capabilities", info.Capabilities).Msg("cloudflare bridge")
	return info, nil
}

// checkBridge returns a *BridgeIncompatibleError when the bridge lacks
// what this worker needs (CloudflareConfig.Needs).
func (c *Cloudflare) checkBridge(ctx context.Context) error {
	info, err := c.Bridge(ctx)
	if err != nil {
		return err
	}
	if missing := info.Missing(c.cfg.Needs); len(missing) > 0 {
		return &BridgeIncompatibleError{Bridge: info.VersionText(), Worker: c.cfg.WorkerVersion, Missing: missing}
	}
	return nil
}

// IsBridgeIncompatible reports whether err is a bridge this worker cannot
// use, and returns it.
func IsBridgeIncompatible(err error) (*BridgeIncompatibleError, bool) {
	var e *BridgeIncompatibleError
	ok := errors.As(err, &e)
	return e, ok
}
