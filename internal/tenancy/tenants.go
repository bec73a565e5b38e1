package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// tenantKey is tenant t's account key, made (and its account JWT stored)
// the first time; created says it was.
func (d *Dir) tenantKey(t string, create bool) (kp nkeys.KeyPair, created bool, err error) {
	if err := ValidTenant(t); err != nil {
		return nil, false, err
	}
	rel := filepath.Join(tenantsDir, t+".nk")
	kp, err = d.seed(rel)
	switch {
	case err == nil:
		return kp, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, err
	case !create:
		return nil, false, fmt.Errorf("%w %q in %s", ErrNoTenant, t, d.Path)
	}
	if kp, err = nkeys.CreateAccount(); err != nil {
		return nil, false, fmt.Errorf("tenancy: %w", err)
	}
	ac := tenantAccount(pub(kp), t, d.m.Fleet, d.m.Prefix)
	if err := d.storeAccount(ac); err != nil {
		return nil, false, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, false, fmt.Errorf("tenancy: %w", err)
	}
	// The seed last: a tenant without it is made again from scratch.
	if err := writeFile(filepath.Join(d.Path, keysDir, rel), seed); err != nil {
		return nil, false, err
	}
	return kp, true, nil
}

// storeAccount signs ac with the operator's key and stores it where the
// server's full resolver finds it.
func (d *Dir) storeAccount(ac *jwt.AccountClaims) error {
	op, err := d.seed("operator.nk")
	if err != nil {
		return fmt.Errorf("tenancy: operator key: %w", err)
	}
	s, err := ac.Encode(op)
	if err != nil {
		return fmt.Errorf("tenancy: account JWT: %w", err)
	}
	return writeFile(d.accountPath(ac.Subject), []byte(s))
}

func (d *Dir) accountPath(pub string) string { return filepath.Join(d.Path, resolverDir, pub+".jwt") }

// AccountJWT is tenant t's current account JWT.
func (d *Dir) AccountJWT(t string) (string, error) {
	kp, _, err := d.tenantKey(t, false)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(d.accountPath(pub(kp)))
	if err != nil {
		return "", fmt.Errorf("tenancy: tenant %s's account: %w", t, err)
	}
	return string(b), nil
}

func (d *Dir) accountClaims(t string) (*jwt.AccountClaims, error) {
	s, err := d.AccountJWT(t)
	if err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAccountClaims(s)
	if err != nil {
		return nil, fmt.Errorf("tenancy: tenant %s's account JWT: %w", t, err)
	}
	if ac.Issuer != d.m.Operator {
		return nil, fmt.Errorf("tenancy: tenant %s's account JWT is not signed by this setup's operator", t)
	}
	return ac, nil
}

// Minted is a tenant's new creds file, and its account JWT (to push when
// the account is new to the server).
type Minted struct {
	Creds      []byte
	AccountJWT string
	NewAccount bool
}

// TenantCreds mints a creds file for tenant t (expiring after ttl; never
// with 0), making t's account first when it has none.
func (d *Dir) TenantCreds(t string, ttl time.Duration) (Minted, error) {
	if ttl < 0 {
		return Minted{}, fmt.Errorf("tenancy: --ttl %s is negative", ttl)
	}
	acc, created, err := d.tenantKey(t, true)
	if err != nil {
		return Minted{}, err
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return Minted{}, fmt.Errorf("tenancy: %w", err)
	}
	perms := tenantPermissions(t, d.m.Prefix)
	creds, err := userCreds(user, acc, "tenant:"+t, &perms, []string{"tenant:" + t}, ttl)
	if err != nil {
		return Minted{}, err
	}
	aj, err := d.AccountJWT(t)
	if err != nil {
		return Minted{}, err
	}
	return Minted{Creds: creds, AccountJWT: aj, NewAccount: created}, nil
}

// Revoke revokes every user and token of tenant t issued up to now, stores
// the account JWT and returns it, to push to the running server.
func (d *Dir) Revoke(t string) (string, error) {
	ac, err := d.accountClaims(t)
	if err != nil {
		return "", err
	}
	// Revocation compares whole seconds: a user issued at or before this
	// second is revoked, so creds minted for t in the same second are too
	// (mint new ones from the next second on).
	ac.RevokeAt(jwt.All, time.Now())
	if err := d.storeAccount(ac); err != nil {
		return "", err
	}
	return d.AccountJWT(t)
}

// revokedAt is when t's creds and tokens were last revoked (zero: never).
func (d *Dir) revokedAt(t string) (time.Time, error) {
	ac, err := d.accountClaims(t)
	if err != nil {
		return time.Time{}, err
	}
	if at, ok := ac.Revocations[jwt.All]; ok {
		return time.Unix(at, 0), nil
	}
	return time.Time{}, nil
}

// Push sends an account JWT to the server on $SYS.REQ.CLAIMS.UPDATE
// (nc: a system account user, e.g. DIR/sys.creds), which applies it at
// once: revoked users are disconnected. It fails with the server's reason.
func Push(ctx context.Context, nc *nats.Conn, accountJWT string) error {
	m, err := nc.RequestWithContext(ctx, "$SYS.REQ.CLAIMS.UPDATE", []byte(accountJWT))
	if err != nil {
		return fmt.Errorf("tenancy: pushing the account JWT to the server: %w", err)
	}
	var r struct {
		Data  *struct{ Code int } `json:"data"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return fmt.Errorf("tenancy: the server's reply to the account update is unreadable: %q", m.Data)
	}
	if r.Error != nil {
		return fmt.Errorf("tenancy: the server refused the account update: %s (%d)", r.Error.Description, r.Error.Code)
	}
	return nil
}
