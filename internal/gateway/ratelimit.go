package gateway

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimit is an upstream 429 or 529 one run got, for admission's
// rate-limit pause (SPEC 10).
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
