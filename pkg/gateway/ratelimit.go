package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimit is an upstream 429 or 529 one run got, for admission's
// rate-limit pause (docs/admission.md).
type RateLimit struct {
	Tenant  string
	QueryID string
	Status  int
	// Until is when the upstream said to try again: now plus retry-after
	// (or retry-after-ms), else the latest anthropic-ratelimit-*-reset.
	// Zero when the answer said neither.
	Until time.Time
}

// rateLimited reports a 429 or 529 answer.
func (g *Gateway) rateLimited(r *run, resp *http.Response) {
	rl := RateLimit{Tenant: r.info.Tenant, QueryID: r.info.QueryID, Status: resp.StatusCode,
		Until: retryUntil(resp.Header, time.Now())}
	g.log.Info().Str("tenant", rl.Tenant).Str("query_id", rl.QueryID).Int("status", rl.Status).
		Time("until", rl.Until).Msg("model upstream rate limit")
	if g.cfg.OnRateLimit != nil {
		g.cfg.OnRateLimit(rl)
	}
}

// retryUntil reads when to retry from an answer's headers: retry-after-ms,
// retry-after (seconds or an HTTP date), else the latest
// anthropic-ratelimit-*-reset (RFC 3339). Zero when none parses.
func retryUntil(h http.Header, now time.Time) time.Time {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return now.Add(time.Duration(ms * float64(time.Millisecond)))
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e9 {
			return now.Add(time.Duration(s * float64(time.Second)))
		}
		if t, err := http.ParseTime(v); err == nil {
			return t
		}
	}
	var latest time.Time
	for k, vs := range h {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, "anthropic-ratelimit-") || !strings.HasSuffix(lk, "-reset") || len(vs) == 0 {
			continue
		}
		if t, err := time.Parse(time.RFC3339, strings.TrimSpace(vs[0])); err == nil && t.After(latest) {
			latest = t
		}
	}
	return latest
}

// AdmissionLine is the 429 as a line admission reads on
// protocol.Names.RateLimitSubject (admission.RateLimitUntil): a rejected
// rate_limit_event whose resetsAt is Until (Unix seconds, rounded up;
// absent when Until is zero, so admission pauses for its default). ok is
// false for a 529: the upstream is overloaded, the tenant is not limited.
func (rl RateLimit) AdmissionLine() (line []byte, ok bool) {
	if rl.Status != http.StatusTooManyRequests {
		return nil, false
	}
	info := map[string]any{"status": "rejected"}
	if !rl.Until.IsZero() {
		info["resetsAt"] = (rl.Until.UnixMilli() + 999) / 1000
	}
	b, _ := json.Marshal(map[string]any{"type": "rate_limit_event", "rate_limit_info": info, "x_fleet": "model gateway"})
	return b, true
}
