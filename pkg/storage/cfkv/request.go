package cfkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	cloudflare "github.com/cloudflare/cloudflare-go/v4"
	"github.com/cloudflare/cloudflare-go/v4/option"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// APIError is a non-2xx answer of the Cloudflare API.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Errors are the envelope's errors (may be empty when the body was not
	// Cloudflare's JSON envelope).
	Errors []APIErrorItem
}

// APIErrorItem is one entry of the envelope's "errors" list.
type APIErrorItem struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d %s", e.Status, http.StatusText(e.Status))
	for i, it := range e.Errors {
		if i == 3 {
			fmt.Fprintf(&b, " (+%d more)", len(e.Errors)-3)
			break
		}
		fmt.Fprintf(&b, "; code %d: %s", it.Code, it.Message)
	}
	return b.String()
}

// transportError marks a failure without a usable HTTP answer (connection
// refused, reset, a body cut short). It is retried.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// maxErrorBody bounds how much of an error body is parsed.
const maxErrorBody = 64 << 10

// parseEnvelopeErrors returns the "errors" of a Cloudflare API envelope
// ({"success":false,"errors":[{"code":…,"message":…}],…}); nil when body is
// not such an envelope. It reads outside input: it never panics, and
// keeps at most 16 items with messages of at most 512 bytes.
func parseEnvelopeErrors(body []byte) []APIErrorItem {
	var env struct {
		Errors []json.RawMessage `json:"errors"`
	}
	if len(body) > maxErrorBody || json.Unmarshal(body, &env) != nil {
		return nil
	}
	var out []APIErrorItem
	for _, raw := range env.Errors {
		if len(out) == 16 {
			break
		}
		var it APIErrorItem
		if json.Unmarshal(raw, &it) != nil {
			continue
		}
		if len(it.Message) > 512 {
			it.Message = it.Message[:512] + "…"
		}
		out = append(out, it)
	}
	return out
}

// parseRetryAfter reads a Retry-After header: delay-seconds (Cloudflare
// sends integers; fractions are accepted) or an HTTP-date. ok is false
// when v is empty or malformed. The result is never negative.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(f) || f < 0 {
			return 0, false
		}
		if f > 365*24*3600 {
			f = 365 * 24 * 3600
		}
		return time.Duration(f * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// failure is a classified request error.
type failure struct {
	retryable  bool
	sentinel   error // storage sentinel to wrap, or nil
	retryAfter time.Duration
	hasAfter   bool
	err        error // *APIError, or the transport error
}

// classify maps a request error (and the raw response, when there was one)
// to a failure.
func classify(err error, raw *http.Response) failure {
	var te *transportError
	if errors.As(err, &te) {
		return failure{retryable: true, sentinel: storage.ErrUnavailable, err: err}
	}
	var own *APIError
	if errors.As(err, &own) {
		// An answer judged bad after the fact (e.g. an oversized value).
		return failure{sentinel: sentinelFor(own.Status), err: own}
	}
	status := 0
	if raw != nil {
		status = raw.StatusCode
	}
	var cfErr *cloudflare.Error
	if errors.As(err, &cfErr) && cfErr.StatusCode != 0 {
		status = cfErr.StatusCode
	}
	if status < 400 {
		// No HTTP answer at all: a transport failure.
		return failure{retryable: true, sentinel: storage.ErrUnavailable, err: err}
	}
	ae := &APIError{Status: status}
	f := failure{err: ae}
	if raw != nil {
		if raw.Body != nil {
			body, _ := io.ReadAll(io.LimitReader(raw.Body, maxErrorBody+1))
			ae.Errors = parseEnvelopeErrors(body)
		}
		f.retryAfter, f.hasAfter = parseRetryAfter(raw.Header.Get("Retry-After"), time.Now())
	}
	f.sentinel = sentinelFor(status)
	f.retryable = retryableStatus(status)
	return f
}

// sentinelFor maps an HTTP status to the storage sentinel it means (nil
// when none fits).
func sentinelFor(status int) error {
	switch {
	case status == http.StatusNotFound:
		return storage.ErrNotFound
	case status == http.StatusRequestEntityTooLarge:
		return storage.ErrTooLarge
	case status == http.StatusRequestURITooLong:
		return storage.ErrInvalidKey
	case retryableStatus(status):
		return storage.ErrUnavailable
	}
	return nil
}

// retryableStatus reports whether a request that got status may succeed
// when sent again.
func retryableStatus(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusConflict ||
		status == http.StatusTooManyRequests || status >= 500
}

// wrap builds the error returned to the caller.
func (f failure) wrap(op, key string) error {
	if f.sentinel == nil {
		return fmt.Errorf("cfkv: %s %q: %w", op, key, f.err)
	}
	return fmt.Errorf("cfkv: %s %q: %w: %w", op, key, f.sentinel, f.err)
}

// callFunc performs one request; opts must be passed to the SDK method.
type callFunc func(ctx context.Context, opts ...option.RequestOption) error

// call runs fn with the account request budget, a per-request timeout and
// retries: 408, 409, 429, 5xx and transport failures are retried up to
// MaxRetries times, waiting Retry-After when the server sends it (capped at
// MaxRetryAfter) and exponential backoff with jitter otherwise. Every
// attempt takes a token from the budget.
func (s *Store) call(ctx context.Context, op, key string, fn callFunc) error {
	for attempt := 0; ; attempt++ {
		if err := s.limiter.Wait(ctx); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return fmt.Errorf("cfkv: %s %q: %w", op, key, cerr)
			}
			return fmt.Errorf("cfkv: %s %q: waiting for the request budget: %w: %w", op, key, storage.ErrUnavailable, err)
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		var raw *http.Response
		err := fn(rctx, option.WithResponseInto(&raw))
		cancel()
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("cfkv: %s %q: %w", op, key, cerr)
		}
		f := classify(err, raw)
		if !f.retryable || attempt >= s.cfg.MaxRetries {
			return f.wrap(op, key)
		}
		wait := s.backoff(attempt, f)
		s.log.Warn().Err(f.err).Str("op", op).Str("key", key).Int("attempt", attempt+1).
			Dur("wait", wait).Msg("Workers KV request failed; retrying")
		if err := sleepCtx(ctx, wait); err != nil {
			return fmt.Errorf("cfkv: %s %q: %w (after %w)", op, key, err, f.wrap(op, key))
		}
	}
}

// backoff returns how long to wait before retry attempt+1.
func (s *Store) backoff(attempt int, f failure) time.Duration {
	if f.hasAfter {
		return min(f.retryAfter, s.cfg.MaxRetryAfter)
	}
	d := 500 * time.Millisecond << min(attempt, 16)
	d = min(d, s.cfg.MaxBackoff)
	// Jitter in [0.8, 1.2) so a fleet does not retry in lockstep.
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
