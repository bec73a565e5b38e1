package protocol

import (
	"bytes"
	"strings"
)

// Admission (docs/admission.md): producers publish on <prefix>.jobs.<tenant>; the
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
	return n.tenantAfter(subject, ".work.")
}

// tenantAfter returns the tenant of <prefix><kind><tenant>.
func (n Names) tenantAfter(subject, kind string) (tenant string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.p()+kind)
	if !found || !ValidTenant(rest) {
		return "", false
	}
	return rest, true
}

// RateLimitSubject is where a worker forwards, as a core message (no
// stream stores it), an agent line of tenant that may report a rate limit
// (MayReportRateLimit): <prefix>.ratelimit.<tenant>. The admitter listens
// here instead of to every query line.
func (n Names) RateLimitSubject(tenant string) string { return n.p() + ".ratelimit." + tenant }

// RateLimitWildcard matches every tenant's RateLimitSubject.
func (n Names) RateLimitWildcard() string { return n.p() + ".ratelimit.*" }

// ParseRateLimitSubject returns the tenant of <prefix>.ratelimit.<tenant>.
func (n Names) ParseRateLimitSubject(subject string) (tenant string, ok bool) {
	return n.tenantAfter(subject, ".ratelimit.")
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
	// Every agent line passes here, so one pass hops from underscore to
	// underscore (IndexByte is vectorised; a line has far fewer
	// underscores than quotes or bytes). Both names hold one at a fixed
	// offset: "rate_limit" at 4, and a key matching "api_error_status"
	// (encoding/json matches keys case-insensitively, so EqualFold; '_'
	// folds to nothing else and a match is all ASCII, since a rune of two
	// or more bytes would leave fewer runes than the key's in its bytes)
	// has its opening quote 4 before its first underscore and a second
	// underscore 6 after it. So every match is found at one of the
	// underscores visited.
	const (
		rl  = "rate_limit"
		key = `"api_error_status"`
	)
	for i := 0; ; i++ {
		u := bytes.IndexByte(line[i:], '_')
		if u < 0 {
			return false
		}
		i += u
		if i < 4 {
			continue
		}
		s := line[i-4:]
		if len(s) >= len(rl) && string(s[:len(rl)]) == rl {
			return true
		}
		if len(s) >= len(key) && s[0] == '"' && s[10] == '_' && bytes.EqualFold(s[:len(key)], []byte(key)) {
			v := bytes.TrimLeft(s[len(key):], " \t\r\n:")
			if len(v) > 0 && v[0] != 'n' {
				return true
			}
		}
	}
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

// HeaderSubject is set by the admitter on an admitted job: the subject the
// job was published on, so that a job refused for its subject is refused
// naming the subject its producer used, not the admitted copy's.
const HeaderSubject = "Fleet-Subject"

// InvalidTenantDLQ is the tenant token of the dead letters of jobs whose
// subject names no valid tenant: <prefix>.dlq._invalid. No tenant can have
// it (a tenant starts with a letter or digit), so such jobs never land
// among a real tenant's dead letters.
const InvalidTenantDLQ = "_invalid"

// Queued reasons: why a job that waits was not admitted yet (the "reason" of
// a queued status).
const (
	ReasonFleetCap    = "fleet_cap"
	ReasonTenantCap   = "tenant_cap"
	ReasonBudget      = "budget"
	ReasonRateLimited = "rate_limited"
)
