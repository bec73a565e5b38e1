package tenancy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// InitOptions configure Init.
type InitOptions struct {
	// Prefix is the fleet's subject prefix. Defaults to "fleet".
	Prefix string
	// ResolverDir is where nats-server keeps account JWTs, as the server
	// sees it (absolute; a container may mount DIR elsewhere). Defaults to
	// DIR/jwt, made absolute.
	ResolverDir string
}

// Init sets up path: keys, account JWTs, nats-auth.conf and the fleet's
// creds files. It refuses a path that exists and is not empty, and builds
// everything beside it first, so a failure leaves nothing behind.
func Init(path string, o InitOptions) error {
	if o.Prefix == "" {
		o.Prefix = "fleet"
	}
	if err := ValidTenant(o.Prefix); err != nil {
		return fmt.Errorf("tenancy: prefix %q must be one subject token", o.Prefix)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("tenancy: %w", err)
	}
	empty := false
	switch ents, err := os.ReadDir(abs); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("tenancy: %w", err)
	case len(ents) > 0:
		return fmt.Errorf("%w: %s is not empty; nothing was changed", ErrExists, path)
	default:
		empty = true
	}
	if o.ResolverDir == "" {
		o.ResolverDir = filepath.Join(abs, resolverDir)
	}
	if !filepath.IsAbs(o.ResolverDir) {
		return fmt.Errorf("tenancy: the resolver directory %q must be absolute (nats-server reads it relative to its working directory)", o.ResolverDir)
	}
	if strings.ContainsAny(o.ResolverDir, "\"\n\\") {
		return fmt.Errorf("tenancy: the resolver directory %q holds a quote, backslash or newline", o.ResolverDir)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return fmt.Errorf("tenancy: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(abs), "."+filepath.Base(abs)+".init-")
	if err != nil {
		return fmt.Errorf("tenancy: %w", err)
	}
	if err := build(tmp, o); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if empty {
		if err := os.Remove(abs); err != nil {
			_ = os.RemoveAll(tmp)
			return fmt.Errorf("tenancy: %w", err)
		}
	}
	if err := os.Rename(tmp, abs); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("tenancy: %w", err)
	}
	return nil
}

// keyset are the keys Init makes.
type keyset struct {
	op, sys, fleet, token, sysUser, dispatcher, worker, admin nkeys.KeyPair
}

func newKeys() (*keyset, error) {
	var k keyset
	var err error
	mk := func(f func() (nkeys.KeyPair, error)) nkeys.KeyPair {
		if err != nil {
			return nil
		}
		var kp nkeys.KeyPair
		kp, err = f()
		return kp
	}
	k.op = mk(nkeys.CreateOperator)
	k.sys, k.fleet, k.token = mk(nkeys.CreateAccount), mk(nkeys.CreateAccount), mk(nkeys.CreateAccount)
	k.sysUser, k.dispatcher, k.worker, k.admin = mk(nkeys.CreateUser), mk(nkeys.CreateUser), mk(nkeys.CreateUser), mk(nkeys.CreateUser)
	if err != nil {
		return nil, fmt.Errorf("tenancy: making keys: %w", err)
	}
	return &k, nil
}

func build(dir string, o InitOptions) error {
	k, err := newKeys()
	if err != nil {
		return err
	}
	opPub, sysPub, fleetPub, tokPub := pub(k.op), pub(k.sys), pub(k.fleet), pub(k.token)
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "agentfleet"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(k.op)
	if err != nil {
		return fmt.Errorf("tenancy: operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(k.op)
	if err != nil {
		return fmt.Errorf("tenancy: system account JWT: %w", err)
	}
	fleetJWT, err := fleetAccount(fleetPub, o.Prefix).Encode(k.op)
	if err != nil {
		return fmt.Errorf("tenancy: fleet account JWT: %w", err)
	}
	for _, d := range []string{keysDir, filepath.Join(keysDir, tenantsDir), resolverDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return fmt.Errorf("tenancy: %w", err)
		}
	}
	files := map[string][]byte{
		filepath.Join(resolverDir, sysPub+".jwt"):   []byte(sysJWT),
		filepath.Join(resolverDir, fleetPub+".jwt"): []byte(fleetJWT),
		ConfFile: []byte(conf(opJWT, sysPub, o.ResolverDir, map[string]string{sysPub: sysJWT, fleetPub: fleetJWT})),
	}
	for name, kp := range map[string]nkeys.KeyPair{"operator.nk": k.op, "sys.nk": k.sys, "fleet.nk": k.fleet, "token.nk": k.token} {
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("tenancy: %w", err)
		}
		files[filepath.Join(keysDir, name)] = seed
	}
	users := []struct {
		file    string
		user    nkeys.KeyPair
		account nkeys.KeyPair
		name    string
		perms   *jwt.Permissions
	}{
		{SysFile, k.sysUser, k.sys, "sys", nil},
		{AdminFile, k.admin, k.fleet, "admin", nil},
		{DispatcherFile, k.dispatcher, k.fleet, "dispatcher", ptr(dispatcherPermissions(o.Prefix))},
		{WorkerFile, k.worker, k.fleet, "worker", ptr(workerPermissions(o.Prefix))},
	}
	for _, u := range users {
		creds, err := userCreds(u.user, u.account, u.name, u.perms, nil, 0)
		if err != nil {
			return err
		}
		files[u.file] = creds
	}
	m := meta{V: 1, Prefix: o.Prefix, Operator: opPub, System: sysPub, Fleet: fleetPub, TokenKey: tokPub, ResolverDir: o.ResolverDir}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	files[metaFile] = append(mb, '\n')
	for name, b := range files {
		if err := writeFile(filepath.Join(dir, name), b); err != nil {
			return err
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func pub(kp nkeys.KeyPair) string {
	p, _ := kp.PublicKey() // a key made here always has one
	return p
}

// userCreds mints a user of account (signed by its key) as a creds file.
func userCreds(user, account nkeys.KeyPair, name string, perms *jwt.Permissions, tags []string, ttl time.Duration) ([]byte, error) {
	uc := jwt.NewUserClaims(pub(user))
	uc.Name = name
	uc.IssuerAccount = ""
	if perms != nil {
		uc.Permissions = *perms
	}
	for _, t := range tags {
		uc.Tags.Add(t)
	}
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	ujwt, err := uc.Encode(account)
	if err != nil {
		return nil, fmt.Errorf("tenancy: user %s: %w", name, err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, fmt.Errorf("tenancy: user %s: %w", name, err)
	}
	return jwt.FormatUserConfig(ujwt, seed)
}

// conf is nats-auth.conf.
func conf(opJWT, sysPub, resolverDir string, preload map[string]string) string {
	var b strings.Builder
	b.WriteString(`# agentfleet: decentralized JWT authorization (docs/tenancy.md), written by
# "dispatcher auth init". Include it from nats-server.conf beside listen and
# jetstream. Accounts: SYS (the system account), FLEET (streams, dispatcher,
# workers, admins) and one per tenant, added at run time by
# "dispatcher tenant creds" and kept in the resolver directory.
`)
	fmt.Fprintf(&b, "operator: %s\nsystem_account: %s\n", opJWT, sysPub)
	fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %q\n  allow_delete: false\n  interval: \"2m\"\n}\n", resolverDir)
	b.WriteString("resolver_preload: {\n")
	for _, k := range slices.Sorted(maps.Keys(preload)) {
		fmt.Fprintf(&b, "  %s: %s\n", k, preload[k])
	}
	b.WriteString("}\n")
	return b.String()
}
