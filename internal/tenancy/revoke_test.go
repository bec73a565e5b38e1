package tenancy_test

import (
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// Revoking a tenant on a running server closes its connections within
// 5 s, refuses it from then on, kills its tokens, and leaves other tenants
// alone. No restart.
func TestRevokeOnRunningServer(t *testing.T) {
	s := newSetup(t)
	aCreds, bCreds := s.creds("a", 0), s.creds("b", 0)
	aTok, err := s.Dir.Token("a", 0)
	require.NoError(t, err)
	bTok, err := s.Dir.Token("b", 0)
	require.NoError(t, err)
	closed, why := make(chan struct{}), make(chan error, 1)
	aErrs := make(chan error, 8)
	a := s.connect(aCreds, aErrs, nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			select {
			case why <- err:
			default:
			}
		}))
	b := s.connect(bCreds, nil)
	got, err := tenancy.VerifyToken(s.Dir.Path, aTok)
	require.NoError(t, err)
	require.Equal(t, "a", got)
	require.NoError(t, a.Flush())

	accJWT, err := s.Dir.Revoke("a")
	require.NoError(t, err)
	sys := s.connect(s.Dir.SysCreds(), nil)
	start := time.Now()
	require.NoError(t, tenancy.Push(ctxT(t, 10*time.Second), sys, accJWT))
	select {
	case <-closed:
		require.Less(t, time.Since(start), 5*time.Second)
		<-why //nolint:errcheck // the reason is in aErrs, checked below
		require.ErrorIs(t, <-aErrs, nats.ErrAuthRevoked)
	case <-time.After(5 * time.Second):
		t.Fatal("a's connection was not closed within 5 s of the revocation")
	}
	_, err = nats.Connect(s.Srv.ClientURL(), nats.UserCredentials(aCreds), nats.MaxReconnects(0))
	require.Error(t, err, "revoked creds connected again")
	_, err = tenancy.VerifyToken(s.Dir.Path, aTok)
	require.ErrorIs(t, err, tenancy.ErrTokenRevoked)

	// b: connected, working, its token good.
	m, err := b.Request("$SYS.REQ.USER.INFO", nil, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(m.Data), "tenant:b")
	require.True(t, b.IsConnected())
	got, err = tenancy.VerifyToken(s.Dir.Path, bTok)
	require.NoError(t, err)
	require.Equal(t, "b", got)
}

// Creds that expired are refused by the server, and ReadCreds says so
// first; a missing or malformed file is named as such.
func TestCredsErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := tenancy.ReadCreds(filepath.Join(dir, "nope.creds"))
	require.ErrorIs(t, err, tenancy.ErrCredsMissing)
	bad := filepath.Join(dir, "bad.creds")
	require.NoError(t, os.WriteFile(bad, []byte("not a creds file"), 0o600))
	_, err = tenancy.ReadCreds(bad)
	require.ErrorIs(t, err, tenancy.ErrCredsMalformed)

	acc, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Tags.Add("tenant:a")
	uc.IssuedAt = time.Now().Add(-time.Hour).Unix()
	uc.Expires = time.Now().Add(-time.Minute).Unix()
	ujwt, err := uc.Encode(acc)
	require.NoError(t, err)
	seed, _ := user.Seed()
	b, err := jwt.FormatUserConfig(ujwt, seed)
	require.NoError(t, err)
	old := filepath.Join(dir, "old.creds")
	require.NoError(t, os.WriteFile(old, b, 0o600))
	_, err = tenancy.ReadCreds(old)
	require.ErrorIs(t, err, tenancy.ErrCredsExpired)

	s := newSetup(t)
	short := s.creds("a", time.Hour)
	ci, err := tenancy.ReadCreds(short)
	require.NoError(t, err)
	require.Equal(t, "a", ci.Tenant)
	require.WithinDuration(t, time.Now().Add(time.Hour), ci.Expires, time.Minute)
	ci, err = tenancy.ReadCreds(filepath.Join(s.Dir.Path, tenancy.WorkerFile))
	require.NoError(t, err)
	require.Empty(t, ci.Tenant)
}

// auth init over an existing setup (or any non-empty directory) refuses
// and changes nothing; over a missing or empty one it sets up.
func TestInitRefusesExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	require.NoError(t, tenancy.Init(path, tenancy.InitOptions{}))
	before := digest(t, path)
	err := tenancy.Init(path, tenancy.InitOptions{})
	require.ErrorIs(t, err, tenancy.ErrExists)
	require.Equal(t, before, digest(t, path))
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "a failed init left something beside the directory")

	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "mine"), []byte("x"), 0o600))
	require.ErrorIs(t, tenancy.Init(other, tenancy.InitOptions{}), tenancy.ErrExists)
	empty := t.TempDir()
	require.NoError(t, tenancy.Init(empty, tenancy.InitOptions{}))
	for _, f := range []string{tenancy.ConfFile, tenancy.DispatcherFile, tenancy.WorkerFile, tenancy.AdminFile, tenancy.SysFile} {
		st, err := os.Stat(filepath.Join(empty, f))
		require.NoError(t, err, f)
		require.Equal(t, fs.FileMode(0o600), st.Mode().Perm(), f)
	}
	require.Error(t, tenancy.Init(t.TempDir()+"/x", tenancy.InitOptions{Prefix: "a.b"}))
	require.Error(t, tenancy.Init(t.TempDir()+"/y", tenancy.InitOptions{ResolverDir: "relative/jwt"}))
}

func digest(t *testing.T, root string) map[string][32]byte {
	out := map[string][32]byte{}
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[strings.TrimPrefix(p, root)] = sha256.Sum256(b)
		return err
	}))
	return out
}

// Tokens: a tenant's verifies as it; expired, forged, malformed and
// another setup's are refused, each with its own error.
func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth")
	require.NoError(t, tenancy.Init(path, tenancy.InitOptions{}))
	d, err := tenancy.Open(path)
	require.NoError(t, err)
	tok, err := d.Token("acme", 0)
	require.NoError(t, err)
	got, err := tenancy.VerifyToken(path, tok)
	require.NoError(t, err)
	require.Equal(t, "acme", got)

	otherPath := filepath.Join(t.TempDir(), "auth")
	require.NoError(t, tenancy.Init(otherPath, tenancy.InitOptions{}))
	other, err := tenancy.Open(otherPath)
	require.NoError(t, err)
	foreign, err := other.Token("acme", 0)
	require.NoError(t, err)
	_, err = d.VerifyToken(foreign)
	require.ErrorIs(t, err, tenancy.ErrTokenSignature)

	// A token whose payload was changed to another tenant.
	body, sig, _ := strings.Cut(strings.TrimPrefix(tok, "aft1_"), ".")
	_ = body
	forged, err := d.Token("evil", 0)
	require.NoError(t, err)
	fbody, _, _ := strings.Cut(strings.TrimPrefix(forged, "aft1_"), ".")
	_, err = d.VerifyToken("aft1_" + fbody + "." + sig)
	require.ErrorIs(t, err, tenancy.ErrTokenSignature)

	for _, bad := range []string{"", "secret", "aft1_", "aft1_x.y", "aft1_e30.AA", strings.Repeat("a", 5000)} {
		_, err = d.VerifyToken(bad)
		require.ErrorIs(t, err, tenancy.ErrTokenMalformed, bad)
	}
	_, err = d.VerifyToken(tok + "x")
	require.Error(t, err)
	_, err = d.Token("../x", 0)
	require.ErrorIs(t, err, tenancy.ErrBadTenant)
	_, err = d.TenantCreds("a.>", 0)
	require.ErrorIs(t, err, tenancy.ErrBadTenant)
	_, err = d.TenantCreds("A", 0)
	require.ErrorIs(t, err, tenancy.ErrBadTenant)
	_, err = d.Revoke("nobody")
	require.ErrorIs(t, err, tenancy.ErrNoTenant)
}
