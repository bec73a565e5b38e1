package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

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
