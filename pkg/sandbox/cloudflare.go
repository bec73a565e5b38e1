package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// Worker (deploy/cloudflare, SPEC section 7), over HTTP with bearer auth.
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
	c := &Cloudflare{cfg: cfg, client: cfg.HTTPClient}
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
// and are not retried. If ctx ends first, the error wraps ctx.Err().
func (c *Cloudflare) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	if err := CheckID(spec.ID); err != nil {
		return nil, fmt.Errorf("cloudflare: create sandbox: %w", err)
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
// reaches it only through the bridge's egress interception, SPEC section 7).
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

// cfErrorBody is the bridge's error answer. Both {"error":"…","code":"…"}
// and {"error":{"code":"…","message":"…"}} are understood.
type cfErrorBody struct {
	Error   json.RawMessage `json:"error"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

// cfHTTPError is a non-2xx answer of the bridge. It unwraps to the
// sentinel its status maps to.
type cfHTTPError struct {
	Status   int
	Code     string // the bridge's error code, e.g. "spawn_failed"
	Message  string
	sentinel error
}

func (e *cfHTTPError) Error() string {
	detail := fmt.Sprintf("HTTP %d", e.Status)
	if e.Code != "" {
		detail += " " + cfClip(e.Code, 64)
	}
	if e.Message != "" {
		detail += ": " + cfClip(e.Message, 300)
	}
	if e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden {
		return fmt.Sprintf("%v: bridge rejected the bearer token (check the bridge token configured for this worker): %s", e.sentinel, detail)
	}
	return fmt.Sprintf("%v: %s", e.sentinel, detail)
}

func (e *cfHTTPError) Unwrap() error { return e.sentinel }

// cfSandboxGone rewrites a 404 that says the sandbox itself is unknown
// (code "sandbox_not_found": destroyed, or lost by the platform) into an
// error wrapping ErrUnavailable, so it is not mistaken for a missing file.
func cfSandboxGone(err error) error {
	if he := (*cfHTTPError)(nil); errors.As(err, &he) && he.Status == http.StatusNotFound && he.Code == "sandbox_not_found" {
		return fmt.Errorf("%w: the bridge no longer knows the sandbox (%v)", ErrUnavailable, err)
	}
	return err
}

// cfStatusError turns a non-2xx answer into a *cfHTTPError: 401/403 and
// other 4xx → ErrInvalid, 404 → ErrNotFound, 408/429/5xx → ErrUnavailable.
func cfStatusError(status int, body []byte) error {
	e := &cfHTTPError{Status: status}
	var b cfErrorBody
	if json.Unmarshal(body, &b) == nil {
		e.Code, e.Message = b.Code, b.Message
		var s string
		var o struct{ Code, Message string }
		if json.Unmarshal(b.Error, &s) == nil {
			e.Message = cmp.Or(e.Message, s)
		} else if json.Unmarshal(b.Error, &o) == nil {
			e.Code, e.Message = cmp.Or(e.Code, o.Code), cmp.Or(e.Message, o.Message)
		}
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.sentinel = ErrInvalid
	case status == http.StatusNotFound:
		e.sentinel = ErrNotFound
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500:
		e.sentinel = ErrUnavailable
	default:
		e.sentinel = ErrInvalid
	}
	return e
}

// newRequest builds an authenticated request to the bridge.
func (c *Cloudflare) newRequest(ctx context.Context, method, path string, query url.Values, contentType string, body []byte) (*http.Request, error) {
	u := c.cfg.BaseURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, Invalidf("build request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req, nil
}

// send does one request and reads at most limit bytes of a 2xx answer. It
// maps failures to sentinels: transport errors wrap ErrUnavailable.
func (c *Cloudflare) send(ctx context.Context, method, path string, query url.Values, contentType string, body []byte, limit int64) (int, []byte, error) {
	req, err := c.newRequest(ctx, method, path, query, contentType, body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, fmt.Errorf("%s %s: %w", method, path, ctx.Err())
		}
		return 0, nil, fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, cfStripURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp.StatusCode, nil, fmt.Errorf("%s %s: %w", method, path, cfStatusError(resp.StatusCode, b))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%w: %s %s: read body: %w", ErrUnavailable, method, path, cfStripURL(err))
	}
	if int64(len(b)) > limit {
		return resp.StatusCode, nil, fmt.Errorf("%w: %s %s: answer larger than %d bytes", ErrInvalid, method, path, limit)
	}
	return resp.StatusCode, b, nil
}

// cfStripURL drops the URL from a *url.Error (it is in the message already
// formatted by the caller, and a base URL could carry a secret path).
func cfStripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// call does one request with a JSON answer decoded into out (if non-nil).
func (c *Cloudflare) call(ctx context.Context, method, path string, query url.Values, contentType string, body []byte, out any) error {
	_, b, err := c.send(ctx, method, path, query, contentType, body, cfMaxJSONBytes)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%w: %s %s: decode answer: %w", ErrUnavailable, method, path, err)
	}
	return nil
}

// retry runs f up to Attempts times while it fails with a retryable error,
// each attempt bounded by RequestTimeout.
func (c *Cloudflare) retry(ctx context.Context, f func(ctx context.Context) error) error {
	var err error
	for attempt := 0; attempt < c.cfg.Attempts; attempt++ {
		if attempt > 0 && !cfSleep(ctx, c.cfg.Backoff.delay(attempt-1)) {
			break
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
		err = f(actx)
		cancel()
		if err == nil || !Retryable(err) || ctx.Err() != nil {
			break
		}
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}

// cfSleep waits d or until ctx is done; it reports whether d elapsed.
func cfSleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// cfSandbox is a sandbox behind the bridge.
type cfSandbox struct {
	c   *Cloudflare
	id  string
	env map[string]string // Spec.Env, resent with every process

	// life is cancelled once the sandbox is destroyed; it stops the
	// goroutines following its processes.
	life   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // process goroutines
}

var _ Sandbox = (*cfSandbox)(nil)

// ID returns the sandbox's name.
func (s *cfSandbox) ID() string { return s.id }

func (s *cfSandbox) path(rest string) string { return "/v1/sb/" + s.id + rest }

// WriteFile writes data to path in the workspace (PUT /file, retried).
func (s *cfSandbox) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := cfCheckPath(path); err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: write file: %w", s.id, err)
	}
	if len(data) > cfMaxFileBytes {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path,
			Invalidf("%d bytes is more than the bridge's %d", len(data), cfMaxFileBytes))
	}
	if s.isClosed() {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path, ErrClosed)
	}
	if data == nil {
		data = []byte{}
	}
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, _, err := s.c.send(ctx, http.MethodPut, s.path("/file"), url.Values{"path": {path}}, "application/octet-stream", data, cfMaxJSONBytes)
		return err
	})
	if err != nil {
		return fmt.Errorf("cloudflare: sandbox %s: write file %s: %w", s.id, path, cfSandboxGone(err))
	}
	return nil
}

// ReadFile reads path from the workspace (GET /file); ErrNotFound if absent.
func (s *cfSandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	if err := cfCheckPath(path); err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file: %w", s.id, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file %s: %w", s.id, path, ErrClosed)
	}
	var data []byte
	err := s.c.retry(ctx, func(ctx context.Context) error {
		var err error
		_, data, err = s.c.send(ctx, http.MethodGet, s.path("/file"), url.Values{"path": {path}}, "", nil, cfMaxFileBytes)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: read file %s: %w", s.id, path, cfSandboxGone(err))
	}
	return data, nil
}

// Destroy deletes the sandbox (DELETE /v1/sb/:id, which stops every
// process), then waits, bounded by ctx, for the goroutines following its
// processes. It is idempotent: a sandbox already gone is fine.
func (s *cfSandbox) Destroy(ctx context.Context) error {
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, _, err := s.c.send(ctx, http.MethodDelete, s.path(""), nil, "", nil, cfMaxJSONBytes)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("cloudflare: destroy sandbox %s: %w", s.id, err)
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	// Followers normally end by themselves: the bridge sends the killed
	// processes' exit events, or answers 404 on re-attachment. Give them a
	// moment (at most a ping period), then stop them.
	wctx, cancel := context.WithTimeout(ctx, min(5*time.Second, s.c.cfg.PingTimeout))
	cfWaitGroup(wctx, &s.wg)
	cancel()
	s.cancel()
	if !cfWaitGroup(ctx, &s.wg) {
		return fmt.Errorf("cloudflare: destroy sandbox %s: waiting for process streams: %w", s.id, ctx.Err())
	}
	return nil
}

func (s *cfSandbox) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// cfWaitGroup waits for wg or ctx; it reports whether wg finished.
func cfWaitGroup(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// cfStartBody is the body of POST /v1/sb/:id/proc.
type cfStartBody struct {
	ProcID    string            `json:"proc_id"`
	Argv      []string          `json:"argv"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	StdinPath string            `json:"stdin_path,omitempty"`
	Stdin     string            `json:"stdin,omitempty"` // "pipe": interactive
}

// cfStartResp is the answer of POST /v1/sb/:id/proc.
type cfStartResp struct {
	ProcID string `json:"proc_id"`
	PID    int    `json:"pid"`
}

// Start starts spec in the sandbox and begins following its output. See
// Cloudflare for stdin, streaming and cancellation. Errors: ErrInvalid (bad
// spec, or the process ID already names a different process), ErrUnavailable,
// ErrClosed.
func (s *cfSandbox) Start(ctx context.Context, spec ProcSpec) (Process, error) {
	return s.start(ctx, spec, false)
}

func (s *cfSandbox) start(ctx context.Context, spec ProcSpec, interactive bool) (*cfProcess, error) {
	if err := s.checkProcSpec(spec); err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, cfClip(spec.ID, 64), err)
	}
	merged := make(map[string]string, len(s.env)+len(spec.Env))
	for k, v := range s.env {
		merged[k] = v
	}
	for k, v := range spec.Env {
		merged[k] = v
	}
	env, err := s.c.filterEnv(merged)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, err)
	}
	if s.isClosed() {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, ErrClosed)
	}
	body := cfStartBody{ProcID: spec.ID, Argv: spec.Argv, Cwd: spec.Dir, Env: env}
	if interactive {
		body.Stdin = "pipe"
	}
	if len(spec.Stdin) > 0 {
		body.StdinPath = cfStdinDir + "/stdin-" + spec.ID
		if err := s.WriteFile(ctx, body.StdinPath, spec.Stdin); err != nil {
			return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: stdin: %w", s.id, spec.ID, err)
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, err)
	}
	var resp cfStartResp
	err = s.c.retry(ctx, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPost, s.path("/proc"), nil, "application/json", raw, &resp)
	})
	if he := (*cfHTTPError)(nil); errors.As(err, &he) && he.Code == "spawn_failed" {
		return nil, &SpawnError{Sandbox: s.id, Process: spec.ID, Program: spec.Argv[0],
			Err: fmt.Errorf("bridge: %s", cfClip(he.Message, 300))}
	}
	if err != nil {
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, cfSandboxGone(err))
	}
	p := newCFProcess(s, spec)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("cloudflare: sandbox %s: start %s: %w", s.id, spec.ID, ErrClosed)
	}
	s.wg.Add(2)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		p.follow()
	}()
	go func() {
		defer s.wg.Done()
		p.watch(ctx)
	}()
	s.c.log.Debug().Str("sandbox_id", s.id).Str("proc_id", spec.ID).Int("pid", resp.PID).Msg("process started")
	return p, nil
}

func (s *cfSandbox) checkProcSpec(spec ProcSpec) error {
	if err := CheckID(spec.ID); err != nil {
		return fmt.Errorf("process: %w", err)
	}
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return Invalidf("argv is empty")
	}
	for _, a := range spec.Argv {
		if strings.ContainsRune(a, 0) {
			return Invalidf("argv contains a NUL byte")
		}
	}
	if spec.Dir != "" {
		if err := cfCheckPath(spec.Dir); err != nil {
			return fmt.Errorf("dir: %w", err)
		}
	}
	if len(spec.Stdin) > cfMaxFileBytes {
		return Invalidf("stdin is %d bytes, more than the bridge's %d", len(spec.Stdin), cfMaxFileBytes)
	}
	if spec.StderrTailBytes < 0 {
		return Invalidf("StderrTailBytes is negative")
	}
	return nil
}

// kill sends POST /kill with signal; it reports the bridge's "killed".
func (s *cfSandbox) kill(ctx context.Context, procID, signal string) (bool, error) {
	raw, _ := json.Marshal(map[string]string{"signal": signal})
	var resp struct {
		Killed bool `json:"killed"`
	}
	err := s.c.retry(ctx, func(ctx context.Context) error {
		return s.c.call(ctx, http.MethodPost, s.path("/proc/"+procID+"/kill"), nil, "application/json", raw, &resp)
	})
	return resp.Killed, err
}

// cfProcStatus is the answer of GET /v1/sb/:id/proc/:proc_id.
type cfProcStatus struct {
	Status   string `json:"status"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// terminal reports whether the status says the process has ended.
func (p cfProcStatus) terminal() bool {
	switch p.Status {
	case "completed", "failed", "killed", "error":
		return true
	}
	return false
}

// status asks the bridge for a process's status (one attempt).
func (s *cfSandbox) status(ctx context.Context, procID string) (cfProcStatus, error) {
	var st cfProcStatus
	ctx, cancel := context.WithTimeout(ctx, s.c.cfg.RequestTimeout)
	defer cancel()
	err := s.c.call(ctx, http.MethodGet, s.path("/proc/"+procID), nil, "", nil, &st)
	return st, err
}

// cfStreamQuery is the query of a stream request resuming at from.
func cfStreamQuery(from [2]int64) url.Values {
	return url.Values{"from": {strconv.FormatInt(from[0], 10) + "," + strconv.FormatInt(from[1], 10)}}
}
