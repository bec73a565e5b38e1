package httpapi

import (
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Principal is who a request acts as.
type Principal struct {
	// Operator may act on every tenant.
	Operator bool
	// Tenant is the one tenant a non-operator may act on.
	Tenant string
}

// Authenticator turns a request into its Principal, or an error (401).
type Authenticator interface {
	Authenticate(r *http.Request) (Principal, error)
}

// ErrUnauthorized is wrapped by every authentication failure.
var ErrUnauthorized = errors.New("unauthorized")

// Auth is the Authenticator of `dispatcher serve`: the operator's token
// (--ui-token) and tenant tokens (docs/tenancy.md). With neither set, loopback clients
// are the operator.
type Auth struct {
	// OperatorToken is --ui-token; "" = none.
	OperatorToken string
	// TenantToken, when set, verifies a tenant token and returns its
	// tenant (tenancy.VerifyToken with the auth directory bound); an
	// error means the token is bad, expired or revoked.
	TenantToken func(token string) (tenant string, err error)
}

// Authenticate implements Authenticator.
func (a Auth) Authenticate(r *http.Request) (Principal, error) {
	if a.OperatorToken == "" && a.TenantToken == nil {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsLoopback() {
			return Principal{Operator: true}, nil
		}
		return Principal{}, errors.Join(ErrUnauthorized, errors.New("no token is configured, so only loopback clients are served"))
	}
	tok, ok := bearer(r)
	if !ok {
		return Principal{}, errors.Join(ErrUnauthorized, errors.New("missing Authorization: Bearer <token>"))
	}
	if a.OperatorToken != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(a.OperatorToken)) == 1 {
		return Principal{Operator: true}, nil
	}
	if a.TenantToken != nil {
		tenant, err := a.TenantToken(tok)
		if err == nil && protocol.ValidTenant(tenant) {
			return Principal{Tenant: tenant}, nil
		}
	}
	// The reason a tenant token failed (expired, revoked) is not told: it
	// would help guessing.
	return Principal{}, errors.Join(ErrUnauthorized, errors.New("the token is not valid (wrong, expired or revoked)"))
}

// WriteUnauthorized answers 401 with the API's JSON error shape
// {"error":{"code":"unauthorized","message"}} and a Bearer challenge. The
// dashboard answers a refused program the same way.
func WriteUnauthorized(w http.ResponseWriter, message string) {
	writeError(w, http.StatusUnauthorized, CodeUnauthorized, message)
}

// SignInFits reports whether a refused request is a browser's to send to a
// sign-in page rather than to answer 401: a GET that sends no
// Authorization header (a program that sent one, right or wrong, wants
// the error, not a page) and accepts HTML.
func SignInFits(r *http.Request) bool {
	if r.Method != http.MethodGet || r.Header.Get("Authorization") != "" {
		return false
	}
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			media, _, _ := strings.Cut(part, ";")
			if m := strings.ToLower(strings.TrimSpace(media)); m == "text/html" || m == "application/xhtml+xml" {
				return true
			}
		}
	}
	return false
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// tenantFor is the tenant a request about one query acts on: a tenant
// principal's own, or for the operator ?tenant= (default "default"). ok is
// false when a tenant principal names another tenant: its queries do not
// exist for it.
func (p Principal) tenantFor(asked string) (string, bool) {
	if p.Operator {
		if asked == "" {
			return protocol.DefaultTenant, true
		}
		return asked, true
	}
	return p.Tenant, asked == "" || asked == p.Tenant
}
