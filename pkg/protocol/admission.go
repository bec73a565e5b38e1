package protocol

import (
	"bytes"
	"strings"
)

// Admission (SPEC 10): producers publish on <prefix>.jobs.<tenant>; the
// admitting dispatcher moves each job it admits to <prefix>.work.<tenant>
// in the same stream, which is all the work consumer reads.

// WorkSubject is where the admitter puts an admitted job of tenant:
// <prefix>.work.<tenant>. Only the dispatcher may publish here.
func (n Names) WorkSubject(tenant string) string { return n.p() + ".work." + tenant }

// WorkWildcard matches every work subject: <prefix>.work.>.
func (n Names) WorkWildcard() string { return n.p() + ".work.>" }

// ParseWorkSubject returns the tenant of <prefix>.work.<tenant>; ok is false
// for anything else.
func (n Names) ParseWorkSubject(subject string) (tenant string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.p()+".work.")
	if !found || !ValidTenant(rest) {
		return "", false
	}
	return rest, true
}

// MsgWildcard matches every query's .msg subject: <prefix>.query.*.*.msg.
func (n Names) MsgWildcard() string { return n.p() + ".query.*.*.msg" }

// RateLimitSubject is where a worker forwards, as a core message (no
// stream stores it), an agent line of tenant that may report a rate limit
// (MayReportRateLimit): <prefix>.ratelimit.<tenant>. The admitter listens
// here instead of to every query line.
func (n Names) RateLimitSubject(tenant string) string { return n.p() + ".ratelimit." + tenant }

// RateLimitWildcard matches every tenant's RateLimitSubject.
func (n Names) RateLimitWildcard() string { return n.p() + ".ratelimit.*" }

// ParseRateLimitSubject returns the tenant of <prefix>.ratelimit.<tenant>.
func (n Names) ParseRateLimitSubject(subject string) (tenant string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.p()+".ratelimit.")
	if !found || !ValidTenant(rest) {
		return "", false
	}
	return rest, true
}

// MaxRateLimitLine is the longest line a worker forwards as a possible
// rate-limit report: such reports are small, and a core message must stay
// under the server's max payload.
const MaxRateLimitLine = 64 << 10

// MayReportRateLimit is the cheap test a worker applies to every agent
// line: false means the line cannot report a rate limit (it holds no
// "rate_limit" and no api_error_status key, in any case, with a value
// other than null); true lines are forwarded, and the admitter parses
// them (admission.RateLimitUntil). Lines that spell these names with \u
// escapes are not recognised (the CLI never writes them so).
func MayReportRateLimit(line []byte) bool {
	if len(line) > MaxRateLimitLine {
		return false
	}
	if bytes.Contains(line, []byte("rate_limit")) {
		return true
	}
	const key = `"api_error_status"`
	for i := 0; i+len(key) <= len(line); i++ {
		// encoding/json matches keys case-insensitively.
		if line[i] != '"' || !bytes.EqualFold(line[i:i+len(key)], []byte(key)) {
			continue
		}
		rest := bytes.TrimLeft(line[i+len(key):], " \t\r\n:")
		if len(rest) > 0 && rest[0] != 'n' {
			return true
		}
	}
	return false
}

// TenantsBucket is the KV bucket of tenant settings (FLEET_TENANTS).
func (n Names) TenantsBucket() string { return n.upper() + "_TENANTS" }

// AdmissionBucket is the KV bucket of admission state that outlives a
// dispatcher: spend per tenant and window, rate-limit pauses (FLEET_ADMISSION).
func (n Names) AdmissionBucket() string { return n.upper() + "_ADMISSION" }

// AdmitterBucket holds the admitter's leadership lease (FLEET_ADMITTER); its
// keys expire by the bucket's TTL unless renewed.
func (n Names) AdmitterBucket() string { return n.upper() + "_ADMITTER" }

// HeaderJobSeq is set by the admitter on an admitted job: the FLEET_JOBS
// sequence of the submission (on <prefix>.jobs.<tenant>), which status
// events carry as job_seq.
const HeaderJobSeq = "Fleet-Job-Seq"

// Queued reasons: why a job that waits was not admitted yet (the "reason" of
// a queued status).
const (
	ReasonFleetCap    = "fleet_cap"
	ReasonTenantCap   = "tenant_cap"
	ReasonBudget      = "budget"
	ReasonRateLimited = "rate_limited"
)
