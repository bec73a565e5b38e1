package tenancy

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
)

// Creds errors: each names what is wrong with a creds file.
var (
	ErrCredsMissing   = errors.New("tenancy: the creds file does not exist")
	ErrCredsMalformed = errors.New("tenancy: the creds file is malformed")
	ErrCredsExpired   = errors.New("tenancy: the creds have expired")
)

// CredsInfo is what a creds file says about its user.
type CredsInfo struct {
	// Tenant is the tenant of tenant creds ("" for the fleet's roles).
	Tenant  string
	Name    string
	Expires time.Time // zero: never
}

// ReadCreds reads and checks a creds file (its JWT and seed decode, it has
// not expired), so a client can say what is wrong before NATS refuses it.
func ReadCreds(path string) (CredsInfo, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return CredsInfo{}, fmt.Errorf("%w: %s", ErrCredsMissing, path)
	}
	if err != nil {
		return CredsInfo{}, fmt.Errorf("tenancy: creds %s: %w", path, err)
	}
	ci, err := ParseCreds(b)
	if err != nil {
		return ci, fmt.Errorf("%s: %w", path, err)
	}
	return ci, nil
}

// ParseCreds decodes a creds file's contents.
func ParseCreds(b []byte) (CredsInfo, error) {
	var ci CredsInfo
	s, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return ci, fmt.Errorf("%w: %w", ErrCredsMalformed, err)
	}
	uc, err := jwt.DecodeUserClaims(s)
	if err != nil {
		return ci, fmt.Errorf("%w: its JWT: %w", ErrCredsMalformed, err)
	}
	if _, err := jwt.ParseDecoratedUserNKey(b); err != nil {
		return ci, fmt.Errorf("%w: its seed: %w", ErrCredsMalformed, err)
	}
	ci.Name = uc.Name
	if uc.Expires > 0 {
		ci.Expires = time.Unix(uc.Expires, 0)
		if !time.Now().Before(ci.Expires) {
			return ci, fmt.Errorf("%w (at %s)", ErrCredsExpired, ci.Expires.UTC().Format(time.RFC3339))
		}
	}
	for _, tag := range uc.Tags {
		if t, ok := strings.CutPrefix(tag, "tenant:"); ok {
			if err := ValidTenant(t); err != nil {
				return ci, fmt.Errorf("%w: %w", ErrCredsMalformed, err)
			}
			ci.Tenant = t
		}
	}
	return ci, nil
}
