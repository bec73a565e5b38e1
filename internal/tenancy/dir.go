package tenancy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Files of an auth directory.
const (
	ConfFile       = "nats-auth.conf"
	DispatcherFile = "dispatcher.creds"
	WorkerFile     = "worker.creds"
	AdminFile      = "admin.creds"
	SysFile        = "sys.creds"
	metaFile       = "auth.json"
	keysDir        = "keys"
	tenantsDir     = "tenants"
	resolverDir    = "jwt"
)

// Errors callers tell apart.
var (
	// ErrExists: auth init over an existing setup.
	ErrExists = errors.New("tenancy: the directory already holds a setup")
	// ErrNotSetUp: the directory has no auth init setup.
	ErrNotSetUp = errors.New("tenancy: no auth setup in the directory (run dispatcher auth init --dir DIR)")
	// ErrNoTenant: the tenant has no account yet (no creds were ever minted).
	ErrNoTenant = errors.New("tenancy: no such tenant")
	// ErrBadTenant: the tenant id is not a single NATS token of the fleet's form.
	ErrBadTenant = errors.New("tenancy: bad tenant id")
)

// meta is DIR/auth.json: the public side of the setup.
type meta struct {
	V           int    `json:"v"`
	Prefix      string `json:"prefix"`
	Operator    string `json:"operator"`
	System      string `json:"system_account"`
	Fleet       string `json:"fleet_account"`
	TokenKey    string `json:"token_key"`
	ResolverDir string `json:"resolver_dir"`
}

// Dir is an auth directory made by Init.
type Dir struct {
	Path string
	m    meta
}

// Open reads the setup in path.
func Open(path string) (*Dir, error) {
	b, err := os.ReadFile(filepath.Join(path, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotSetUp, path)
	}
	if err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil || m.V != 1 || m.Fleet == "" || m.Operator == "" {
		return nil, fmt.Errorf("tenancy: %s is not an auth setup this version reads", filepath.Join(path, metaFile))
	}
	return &Dir{Path: path, m: m}, nil
}

// Prefix is the fleet's subject prefix the setup was made for.
func (d *Dir) Prefix() string { return d.m.Prefix }

// SysCreds is the path of the system account's creds (for pushing account
// updates to the server).
func (d *Dir) SysCreds() string { return filepath.Join(d.Path, SysFile) }

// ValidTenant checks a tenant id: the wire contract's pattern, which is one
// NATS subject token (no '.', '*', '>' or spaces), so it can be pasted
// into subjects of permissions and imports.
func ValidTenant(t string) error {
	if !protocol.ValidTenant(t) {
		return fmt.Errorf("%w %q: must match %s", ErrBadTenant, t, protocol.TenantPattern)
	}
	return nil
}

func (d *Dir) seed(rel string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(filepath.Join(d.Path, keysDir, rel))
	if errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	kp, err := nkeys.FromSeed(b)
	if err != nil {
		return nil, fmt.Errorf("tenancy: key %s: %w", rel, err)
	}
	return kp, nil
}

// writeFile writes b to path atomically (a temporary file renamed over
// it), readable by the owner only.
func writeFile(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("tenancy: writing %s: %w", path, err)
	}
	return nil
}
