package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// CloudflareName is the provider name of Cloudflare (jobs' "sandbox" field).
const CloudflareName = "cloudflare"

// Limits shared with the bridge (deploy/cloudflare/README.md).
const (
	// cfMaxFileBytes is the largest file WriteFile/ReadFile move (the
	// bridge's 32 MiB RPC payload limit).
	cfMaxFileBytes = 32 << 20
	// cfMaxJSONBytes bounds a JSON response body.
	cfMaxJSONBytes = 1 << 20
	// cfMaxEventBytes bounds one SSE line or event.
	cfMaxEventBytes = 16 << 20
	// cfStdinDir is the workspace directory Start writes ProcSpec.Stdin to.
	cfStdinDir = ".fleet"
)

// Backoff is an exponential backoff with jitter: attempt n waits about
// Initial*2^n, capped at Max.
type Backoff struct {
	// Initial is the first delay. Defaults to 250ms.
	Initial time.Duration
	// Max caps the delay. Defaults to 5s (or Initial, if larger).
	Max time.Duration
}

func (b Backoff) withDefaults() Backoff {
	b.Initial = cmp.Or(b.Initial, 250*time.Millisecond)
	b.Max = cmp.Or(b.Max, max(5*time.Second, b.Initial))
	return b
}

// delay returns the wait before retry number n (0-based): half fixed, half
// random, so that many workers retrying together spread out.
func (b Backoff) delay(n int) time.Duration {
	d := b.Initial
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(half+1)
}

// CloudflareConfig configures the Cloudflare provider.
type CloudflareConfig struct {
	// BaseURL is the bridge Worker's URL (http or https), e.g.
	// "https://fleet-bridge.example.workers.dev". Required.
	BaseURL string
	// Token is the bridge's bearer token. Required. It is sent only in the
	// Authorization header: never logged, never put in a sandbox's env.
	Token string
	// HTTPClient sends the requests. It must not set Timeout (exec streams
	// are long-lived; every call is bounded by its ctx and the timeouts
	// below). Defaults to a client with its own transport, which Close
	// releases.
	HTTPClient *http.Client
	// ReadyTimeout bounds Create: the create-or-wake call is retried on 503
	// and transport errors until the sandbox is ready or this much time has
	// passed (cold starts take seconds, with long tails). Defaults to 3m.
	ReadyTimeout time.Duration
	// PingTimeout is the read deadline of an exec stream: the bridge sends
	// ": ping" every 15 s, so a stream silent this long is dead and is
	// re-attached. Defaults to 45s.
	PingTimeout time.Duration
	// RequestTimeout bounds each attempt of a short call (start, kill,
	// status, files, destroy). Defaults to 30s.
	RequestTimeout time.Duration
	// SleepAfter is the sandbox's idle time before the platform puts it to
	// sleep (a backstop against leaks; the worker destroys sandboxes it is
	// done with). Sent in whole seconds. Defaults to 10m.
	SleepAfter time.Duration
	// Backoff paces retries of every call and stream re-attachment.
	// Defaults to Backoff{} with its defaults.
	Backoff Backoff
	// Attempts is how many times a short, idempotent call is tried when the
	// bridge is unavailable (503, 5xx, transport error). Defaults to 5.
	Attempts int
	// StreamRetries is how many times in a row an exec stream may fail
	// without delivering anything new before the process is given up as
	// unreachable (Wait then returns an error wrapping ErrUnavailable).
	// Defaults to 8.
	StreamRetries int
	// Logger receives warnings (stream re-attachments, retries). Defaults to
	// a no-op logger.
	Logger *zerolog.Logger
	// Needs is what the worker uses of the bridge (capabilities of GET
	// /v1/version); Create refuses a bridge that lacks any with a
	// *BridgeIncompatibleError. Defaults to BridgeNeeds.
	Needs []string
	// WorkerVersion names this worker in that error. Defaults to
	// "unknown".
	WorkerVersion string
}

func (c CloudflareConfig) withDefaults() CloudflareConfig {
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	c.ReadyTimeout = cmp.Or(c.ReadyTimeout, 3*time.Minute)
	c.PingTimeout = cmp.Or(c.PingTimeout, 45*time.Second)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 30*time.Second)
	c.SleepAfter = cmp.Or(c.SleepAfter, 10*time.Minute)
	c.Backoff = c.Backoff.withDefaults()
	c.Attempts = cmp.Or(c.Attempts, 5)
	c.StreamRetries = cmp.Or(c.StreamRetries, 8)
	if c.Needs == nil {
		c.Needs = BridgeNeeds
	}
	c.WorkerVersion = cmp.Or(c.WorkerVersion, "unknown")
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

func (c CloudflareConfig) validate() error {
	u, err := url.Parse(c.BaseURL)
	switch {
	case c.BaseURL == "":
		return Invalidf("cloudflare: BaseURL is required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return Invalidf("cloudflare: BaseURL must be an http(s) URL")
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return Invalidf("cloudflare: BaseURL must not carry a query, fragment or user info")
	case c.Token == "":
		return Invalidf("cloudflare: Token is required")
	case strings.ContainsAny(c.Token, "\r\n\x00 "):
		return Invalidf("cloudflare: Token must not contain spaces or control characters")
	case c.HTTPClient != nil && c.HTTPClient.Timeout != 0:
		return Invalidf("cloudflare: HTTPClient must not set Timeout (exec streams are long-lived)")
	case c.ReadyTimeout < 0 || c.PingTimeout < 0 || c.RequestTimeout < 0 || c.SleepAfter < 0:
		return Invalidf("cloudflare: timeouts must not be negative")
	case c.SleepAfter < time.Second:
		return Invalidf("cloudflare: SleepAfter must be at least 1s")
	case c.Attempts < 1 || c.StreamRetries < 1:
		return Invalidf("cloudflare: Attempts and StreamRetries must be at least 1")
	case c.Backoff.Initial < 0 || c.Backoff.Max < c.Backoff.Initial:
		return Invalidf("cloudflare: Backoff must have 0 <= Initial <= Max")
	}
	return nil
}

// Cloudflare runs sandboxes in Cloudflare Sandboxes through the bridge
// Worker (deploy/cloudflare and its README.md), over HTTP with bearer auth.
//
// Create does the explicit ensure-ready step (PUT /v1/sb/:id, retried on
// 503 until ReadyTimeout). Start writes ProcSpec.Stdin to
// ".fleet/stdin-<proc id>" in the workspace and starts the process with that
// file as stdin (POST /proc, idempotent on the process ID, so a retried start
// re-attaches rather than starting twice), then follows its SSE stream:
// stdout feeds Process.Stdout, stderr feeds ProcSpec.Stderr and the kept
// tail.
//
// Sandboxes are Interactive: StartInteractive starts the process with
// "stdin": "pipe" (a FIFO in the container), and its Stdin writes go to
// POST /proc/:id/stdin?off=N, chunked to 64 KiB, each carrying its byte
// offset so a write retried after a lost answer is applied once; Close is
// POST /proc/:id/stdin/close (cloudflare_stdin.go).
//
// Streams are distrusted. A stream that ends without an exit event, fails, or
// stays silent for PingTimeout (no ": ping") is re-attached with
// from=<stdout bytes delivered>,<stderr bytes delivered>, so every byte is
// delivered exactly once; between attempts the process's status is
// reconciled (GET /proc/:id; an unknown process ends the wait at once).
// After StreamRetries attempts in a row without progress, Wait returns an
// error wrapping ErrUnavailable and Stdout fails with the same error: a run
// is never reported as finished without the bridge's exit event.
//
// Destroy deletes the sandbox, which kills its processes; a process whose
// exit event was not received by then is reported killed by SIGKILL.
//
// Cancellation: if the ctx given to Start is cancelled before the process
// exits, the process is killed (POST /kill SIGKILL, which the bridge applies
// to the process group); Wait then reports it killed. Stop sends SIGTERM,
// waits up to the grace period, then SIGKILL.
//
// Secrets: the bridge token is only ever sent in the Authorization header.
// Environment variables are filtered before they are sent (see
// DeniedEnvName), and any variable whose value holds the token is dropped.
// Spec.Env is sent at create and again, merged under ProcSpec.Env, with
// every process, so a sandbox that woke from sleep still has it.
//
// Errors: 503, other 5xx, 408, 429 and transport failures wrap
// ErrUnavailable (retryable); 401/403 and other 4xx wrap ErrInvalid; 404 on
// a file wraps ErrNotFound.
type Cloudflare struct {
	cfg    CloudflareConfig
	client *http.Client
	own    *http.Transport // non-nil when the client is ours
	log    zerolog.Logger
	// bridge is what the bridge supports once learned (Bridge), under
	// bridgeLock (a channel, so a waiter's ctx can end its wait).
	bridge     *BridgeInfo
	bridgeLock chan struct{}
}

var _ Provider = (*Cloudflare)(nil)

// NewCloudflare returns a Cloudflare provider. It fills in defaults and
// returns an error wrapping ErrInvalid for a bad config. It does not contact
// the bridge.
func NewCloudflare(cfg CloudflareConfig) (*Cloudflare, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Cloudflare{cfg: cfg, client: cfg.HTTPClient, bridgeLock: make(chan struct{}, 1)}
	if c.client == nil {
		c.own = http.DefaultTransport.(*http.Transport).Clone()
		c.client = &http.Client{Transport: c.own}
	}
	c.log = cfg.Logger.With().Str("component", "sandbox").Str("provider", CloudflareName).Logger()
	return c, nil
}

// Name returns "cloudflare".
func (c *Cloudflare) Name() string { return CloudflareName }

// Close releases idle connections of the provider's own HTTP transport. It
// does not destroy sandboxes.
func (c *Cloudflare) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// cfCreateBody is the body of PUT /v1/sb/:id.
type cfCreateBody struct {
	SleepAfter int64             `json:"sleep_after,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
}

// cfCreateResp is the response of PUT /v1/sb/:id.
type cfCreateResp struct {
	ID    string `json:"id"`
	Ready bool   `json:"ready"`
}

// Create creates or wakes the sandbox spec.ID and waits until it is ready.
// It retries 503 and transport failures with backoff for up to ReadyTimeout,
// then returns an error wrapping ErrUnavailable; 4xx answers wrap ErrInvalid
// and are not retried. If ctx ends first, the error wraps ctx.Err(). A
// bridge that lacks what the worker needs (Bridge, asked once) is refused
// before anything is created, with a *BridgeIncompatibleError.
func (c *Cloudflare) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := CheckID(spec.ID); err != nil {
		return nil, fmt.Errorf("cloudflare: create sandbox: %w", err)
	}
	if err := c.checkBridge(ctx); err != nil {
		return nil, fmt.Errorf("cloudflare: create sandbox %s: %w", spec.ID, err)
	}
	env, err := c.filterEnv(spec.Env)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: create sandbox %s: %w", spec.ID, err)
	}
	body, err := json.Marshal(cfCreateBody{SleepAfter: int64(c.cfg.SleepAfter / time.Second), Env: env})
	if err != nil {
		return nil, fmt.Errorf("cloudflare: create sandbox %s: %w", spec.ID, err)
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	path := "/v1/sb/" + spec.ID
	for attempt := 0; ; attempt++ {
		var resp cfCreateResp
		err = c.call(rctx, http.MethodPut, path, nil, "application/json", body, &resp)
		if err == nil && !resp.Ready {
			err = fmt.Errorf("%w: bridge answered ready=false", ErrUnavailable)
		}
		if err == nil {
			return c.newSandbox(spec), nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("cloudflare: create sandbox %s: %w (last error: %v)", spec.ID, ctx.Err(), err)
		}
		if !Retryable(err) && rctx.Err() == nil {
			return nil, fmt.Errorf("cloudflare: create sandbox %s: %w", spec.ID, err)
		}
		if rctx.Err() != nil || !cfSleep(rctx, c.cfg.Backoff.delay(attempt)) {
			if !Retryable(err) {
				err = fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return nil, fmt.Errorf("cloudflare: create sandbox %s: not ready after %s (%d attempts): %w",
				spec.ID, c.cfg.ReadyTimeout, attempt+1, err)
		}
		c.log.Warn().Str("sandbox_id", spec.ID).Int("attempt", attempt+1).Err(err).Msg("sandbox not ready, retrying create")
	}
}

func (c *Cloudflare) newSandbox(spec Spec) *cfSandbox {
	life, cancel := context.WithCancel(context.Background())
	return &cfSandbox{c: c, id: spec.ID, env: maps.Clone(spec.Env), life: life, cancel: cancel}
}

// DeniedEnvName reports whether an environment variable name must never be
// passed into a Cloudflare sandbox: every name DeniedEnv denies (the
// worker's secrets and configuration), plus names ending in _TOKEN, _SECRET,
// _SECRET_KEY, _PASSWORD, _CREDENTIALS or _API_KEY (an agent's API key
// reaches it only through the bridge's egress interception, deploy/cloudflare/README.md).
// Names are compared case-insensitively.
func DeniedEnvName(name string) bool {
	if DeniedEnv(name) {
		return true
	}
	n := strings.ToUpper(name)
	for _, s := range []string{"_TOKEN", "_SECRET", "_SECRET_KEY", "_PASSWORD", "_CREDENTIALS", "_API_KEY"} {
		if strings.HasSuffix(n, s) {
			return true
		}
	}
	return false
}

// filterEnv validates env and drops denied names (DeniedEnvName) and any
// variable whose value holds the bridge token. Dropped names (never values)
// are logged.
func (c *Cloudflare) filterEnv(env map[string]string) (map[string]string, error) {
	if err := checkEnv(env); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(env))
	var dropped []string
	for k, v := range env {
		if DeniedEnvName(k) || v == c.cfg.Token || (len(c.cfg.Token) >= 8 && strings.Contains(v, c.cfg.Token)) {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	if len(dropped) > 0 {
		slices.Sort(dropped)
		c.log.Warn().Strs("dropped_env", dropped).Msg("environment variables on the deny-list were not passed to the sandbox")
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// cfCheckPath checks a workspace-relative path: not empty, not absolute,
// no ".." element, no NUL or backslash.
func cfCheckPath(p string) error {
	switch {
	case p == "":
		return Invalidf("path is empty")
	case strings.HasPrefix(p, "/"):
		return Invalidf("path %q is absolute; paths are relative to the workspace", cfClip(p, 200))
	case strings.ContainsAny(p, "\x00\\"):
		return Invalidf("path %q contains NUL or a backslash", cfClip(p, 200))
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return Invalidf("path %q escapes the workspace", cfClip(p, 200))
		}
	}
	return nil
}
