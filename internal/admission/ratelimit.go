package admission

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Rate limits: lines a worker forwarded that report one pause their
// tenant.

type pauseReq struct {
	tenant string
	until  time.Time
}

// pauser stores rate-limit pauses found in relayed lines, off the
// subscription's goroutine.
func (a *Admitter) pauser(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.pauseQ:
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := extendPause(pctx, a.state, p.tenant, p.until); err != nil {
				a.log.Warn().Err(err).Str("tenant", p.tenant).Msg("storing a rate-limit pause failed")
			} else {
				a.log.Info().Str("tenant", p.tenant).Time("until", p.until).Msg("tenant paused: rate limited")
			}
			cancel()
		}
	}
}

// onLine looks at one agent line a worker forwarded (protocol.RateLimitSubject)
// for a rejected rate limit.
func (a *Admitter) onLine(m *nats.Msg) {
	if !protocol.MayReportRateLimit(m.Data) {
		return
	}
	tenant, ok := a.names.ParseRateLimitSubject(m.Subject)
	if !ok {
		return
	}
	until, hit := RateLimitUntil(m.Data, a.cfg.Now(), a.cfg.RateLimitPause)
	if !hit {
		return
	}
	select {
	case a.pauseQ <- pauseReq{tenant: tenant, until: until}:
	default:
		a.log.Warn().Str("tenant", tenant).Msg("rate-limit pause queue full; dropping one")
	}
}

// RateLimitUntil reads one agent stdout line and reports whether it says
// the tenant's credential is rate limited, and until when: a
// rate_limit_event whose rate_limit_info.status is "rejected" (until its
// resetsAt, Unix seconds, or now+pause without one), a result with
// api_error_status 429, or an assistant error "rate_limit" (now+pause).
func RateLimitUntil(line []byte, now time.Time, pause time.Duration) (time.Time, bool) {
	var v struct {
		Type          string `json:"type"`
		RateLimitInfo *struct {
			Status   string  `json:"status"`
			ResetsAt float64 `json:"resetsAt"`
		} `json:"rate_limit_info"`
		APIErrorStatus any    `json:"api_error_status"`
		Error          string `json:"error"`
	}
	if json.Unmarshal(line, &v) != nil {
		return time.Time{}, false
	}
	switch {
	case v.Type == protocol.TypeRateLimitEvent && v.RateLimitInfo != nil && v.RateLimitInfo.Status == "rejected":
		if r := v.RateLimitInfo.ResetsAt; r > 0 && r < 1e11 {
			return time.Unix(int64(r), 0).UTC(), true
		}
		return now.Add(pause), true
	case v.Type == protocol.TypeResult && (v.APIErrorStatus == float64(429) || v.APIErrorStatus == "429"):
		return now.Add(pause), true
	case v.Type == protocol.TypeAssistant && v.Error == "rate_limit":
		return now.Add(pause), true
	}
	return time.Time{}, false
}
