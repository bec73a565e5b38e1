package tenancy

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/nats-io/nuid"
)

// tokenPrefix starts every tenant token, so one is told from the
// operator's --ui-token at a glance.
const tokenPrefix = "aft1_"

// maxTokenLen bounds what VerifyToken decodes.
const maxTokenLen = 2048

// Token errors: each names what is wrong with a token.
var (
	ErrTokenMalformed = errors.New("tenancy: the token is malformed")
	ErrTokenSignature = errors.New("tenancy: the token's signature is not this setup's")
	ErrTokenExpired   = errors.New("tenancy: the token has expired")
	ErrTokenRevoked   = errors.New("tenancy: the token was revoked")
)

// tokenClaims are what a token says.
type tokenClaims struct {
	Tenant  string `json:"t"`
	Issued  int64  `json:"iat"`
	Expires int64  `json:"exp,omitempty"`
	ID      string `json:"jti"`
}

// Token mints a bearer token for tenant t's HTTP access (expiring after
// ttl; never with 0). t must have an account (creds minted once).
func (d *Dir) Token(t string, ttl time.Duration) (string, error) {
	if ttl < 0 {
		return "", fmt.Errorf("tenancy: --ttl %s is negative", ttl)
	}
	if _, _, err := d.tenantKey(t, true); err != nil {
		return "", err
	}
	kp, err := d.seed("token.nk")
	if err != nil {
		return "", fmt.Errorf("tenancy: token key: %w", err)
	}
	c := tokenClaims{Tenant: t, Issued: time.Now().Unix(), ID: nuid.Next()}
	if ttl > 0 {
		c.Expires = time.Now().Add(ttl).Unix()
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	sig, err := kp.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("tenancy: signing the token: %w", err)
	}
	enc := base64.RawURLEncoding
	return tokenPrefix + enc.EncodeToString(payload) + "." + enc.EncodeToString(sig), nil
}

// parseToken splits and decodes a token without checking its signature.
func parseToken(tok string) (tokenClaims, []byte, []byte, error) {
	var c tokenClaims
	if len(tok) > maxTokenLen {
		return c, nil, nil, fmt.Errorf("%w: longer than %d bytes", ErrTokenMalformed, maxTokenLen)
	}
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return c, nil, nil, fmt.Errorf("%w: it does not start with %q", ErrTokenMalformed, tokenPrefix)
	}
	p64, s64, ok := strings.Cut(rest, ".")
	if !ok {
		return c, nil, nil, fmt.Errorf("%w: no signature", ErrTokenMalformed)
	}
	enc := base64.RawURLEncoding
	payload, err := enc.DecodeString(p64)
	if err != nil {
		return c, nil, nil, fmt.Errorf("%w: payload: %w", ErrTokenMalformed, err)
	}
	sig, err := enc.DecodeString(s64)
	if err != nil {
		return c, nil, nil, fmt.Errorf("%w: signature: %w", ErrTokenMalformed, err)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, nil, nil, fmt.Errorf("%w: payload: %w", ErrTokenMalformed, err)
	}
	if ValidTenant(c.Tenant) != nil || c.Issued <= 0 || c.Expires < 0 {
		return c, nil, nil, fmt.Errorf("%w: bad claims", ErrTokenMalformed)
	}
	return c, payload, sig, nil
}

// VerifyToken checks a tenant token against the setup in dir and returns
// its tenant: signed by dir's token key, not expired, not revoked (tenant
// revoke revokes tokens too). The error names which check failed.
func VerifyToken(dir, tok string) (string, error) {
	d, err := Open(dir)
	if err != nil {
		return "", err
	}
	return d.VerifyToken(tok)
}

// VerifyToken is the package's VerifyToken on an open Dir.
func (d *Dir) VerifyToken(tok string) (string, error) {
	c, payload, sig, err := parseToken(tok)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.FromPublicKey(d.m.TokenKey)
	if err != nil {
		return "", fmt.Errorf("tenancy: the setup's token key: %w", err)
	}
	if kp.Verify(payload, sig) != nil {
		return "", ErrTokenSignature
	}
	if c.Expires > 0 && time.Now().Unix() >= c.Expires {
		return "", fmt.Errorf("%w (at %s)", ErrTokenExpired, time.Unix(c.Expires, 0).UTC().Format(time.RFC3339))
	}
	at, err := d.revokedAt(c.Tenant)
	if err != nil {
		return "", err
	}
	if !at.IsZero() && at.Unix() >= c.Issued {
		return "", fmt.Errorf("%w (tenant %s revoked at %s)", ErrTokenRevoked, c.Tenant, at.UTC().Format(time.RFC3339))
	}
	return c.Tenant, nil
}
