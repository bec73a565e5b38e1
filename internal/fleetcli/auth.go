package fleetcli

// Tenancy (docs/tenancy.md) on the command line: auth init, tenant creds|revoke|token, and
// --nats-creds with a tenant's creds (the CLI then works on that tenant).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// authCommand is the command for args when they are one of the
// tenancy subcommands (tenant creds|revoke|token), which share the name
// "tenant" with the admission settings; nil otherwise.
func authCommand(args []string) Command {
	if len(args) > 1 && args[0] == "tenant" {
		switch args[1] {
		case "creds", "revoke", "token":
			return &tenantAuthCmd{}
		}
	}
	return nil
}

// authCmd is `dispatcher auth init`.
type authCmd struct {
	dir, resolverDir string
}

func (c *authCmd) Help() Help {
	return Help{
		Name: "auth", Args: "init --dir DIR",
		Summary: "set up per-tenant NATS credentials (decentralized JWT) once",
		Description: `Makes, in DIR (created when missing; refused when it holds anything):
the operator's and accounts' keys, nats-auth.conf for nats-server to include
beside its listen and jetstream settings, and creds files for the fleet's own
roles: dispatcher.creds, worker.creds, admin.creds (every tenant, tenant set,
dead letters) and sys.creds (pushes account updates to the server). Tenants
come later, with 'dispatcher tenant creds'. DIR holds secrets: keep it
private. See docs/tenancy.md.`,
		Examples: `dispatcher auth init --dir /etc/agentfleet/auth
dispatcher auth init --dir ./auth --resolver-dir /etc/nats/auth/jwt   # where a container mounts DIR`,
	}
}

func (c *authCmd) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "the auth directory (env FLEET_DIR)")
	fs.StringVar(&c.resolverDir, "resolver-dir", "", "the account JWT directory as nats-server sees it, absolute [DIR/jwt]")
}

func (c *authCmd) Validate(fs *pflag.FlagSet) error {
	if fs.NArg() != 1 || fs.Arg(0) != "init" {
		return fmt.Errorf("auth: want 'auth init --dir DIR', got %q", fs.Args())
	}
	if c.dir == "" {
		return errors.New("auth init: --dir is required")
	}
	return nil
}

func (c *authCmd) Run(_ context.Context, e *Env) int {
	err := tenancy.Init(c.dir, tenancy.InitOptions{Prefix: e.Common.Prefix, ResolverDir: c.resolverDir})
	if err != nil {
		fmt.Fprintf(e.Err, "dispatcher auth init: %v\n", err)
		return ExitFailed
	}
	fmt.Fprintf(e.Out, `set up %s:
  %s   include it from nats-server.conf (beside listen and jetstream)
  %s %s %s   the fleet's roles (--nats-creds)
  %s   pushes account updates (tenant revoke)
next: dispatcher tenant creds TENANT --dir %s --out TENANT.creds
`, c.dir, filepath.Join(c.dir, tenancy.ConfFile), tenancy.DispatcherFile, tenancy.WorkerFile, tenancy.AdminFile,
		tenancy.SysFile, c.dir)
	return ExitOK
}

// tenantAuthCmd is `dispatcher tenant creds|revoke|token TENANT --dir DIR`.
type tenantAuthCmd struct {
	sub, tenant, dir, out string
	ttl                   time.Duration
}

func (c *tenantAuthCmd) Help() Help {
	return Help{
		Name: "tenant", Args: "creds|revoke|token <tenant> --dir DIR",
		Summary: "a tenant's NATS creds file or HTTP token, or revoke them all",
		Description: `creds mints a NATS creds file for one tenant (to stdout, or --out FILE):
with it a client publishes fleet.jobs.<tenant>, uses the fleet API and this
CLI for that tenant's queries, subscribes to fleet.query.<tenant>.> and
replays them with JetStream API prefix $JS.FLEET.API; nothing of any other
tenant. The first creds of a tenant make its NATS account.
revoke stops every creds file and token of the tenant within seconds on the
running server (--nats-url, with DIR/sys.creds), disconnecting its clients;
its running jobs go on. Creds minted from the next second on work.
token prints a bearer token with the same scope for the dashboard and the
HTTP API (dispatcher serve --auth-dir DIR).`,
		Examples: `dispatcher tenant creds acme --dir /etc/agentfleet/auth --out acme.creds
dispatcher tenant creds acme --dir ./auth --ttl 720h > acme.creds
dispatcher tenant revoke acme --dir ./auth --nats-url nats://nats:4222
dispatcher tenant token acme --dir ./auth`,
	}
}

func (c *tenantAuthCmd) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.dir, "dir", "", "the auth directory of 'auth init' (env FLEET_DIR)")
	fs.DurationVar(&c.ttl, "ttl", 0, "creds, token: expire after this long (0: never)")
	fs.StringVar(&c.out, "out", "", "creds: write the creds file here (0600) instead of stdout")
}

func (c *tenantAuthCmd) Validate(fs *pflag.FlagSet) error {
	c.sub = fs.Arg(0)
	if fs.NArg() != 2 {
		return fmt.Errorf("tenant %s takes one tenant, got %q", c.sub, fs.Args()[1:])
	}
	c.tenant = fs.Arg(1)
	if err := tenancy.ValidTenant(c.tenant); err != nil {
		return err
	}
	if c.dir == "" {
		return fmt.Errorf("tenant %s: --dir is required", c.sub)
	}
	if c.ttl < 0 {
		return fmt.Errorf("--ttl %s is negative", c.ttl)
	}
	if c.sub == "revoke" && (fs.Changed("ttl") || fs.Changed("out")) {
		return errors.New("--ttl and --out go with tenant creds and token")
	}
	if c.sub == "token" && fs.Changed("out") {
		return errors.New("--out goes with tenant creds")
	}
	return nil
}

func (c *tenantAuthCmd) Run(ctx context.Context, e *Env) int {
	d, err := tenancy.Open(c.dir)
	if err != nil {
		fmt.Fprintf(e.Err, "dispatcher tenant %s: %v\n", c.sub, err)
		return ExitFailed
	}
	switch c.sub {
	case "creds":
		return c.creds(ctx, e, d)
	case "token":
		tok, err := d.Token(c.tenant, c.ttl)
		if err != nil {
			fmt.Fprintf(e.Err, "dispatcher tenant token: %v\n", err)
			return ExitFailed
		}
		fmt.Fprintln(e.Out, tok)
		return ExitOK
	}
	return c.revoke(ctx, e, d)
}

func (c *tenantAuthCmd) creds(ctx context.Context, e *Env, d *tenancy.Dir) int {
	m, err := d.TenantCreds(c.tenant, c.ttl)
	if err != nil {
		fmt.Fprintf(e.Err, "dispatcher tenant creds: %v\n", err)
		return ExitFailed
	}
	if m.NewAccount {
		// A server whose resolver directory is DIR/jwt finds the account
		// there on the tenant's first connect; one elsewhere needs it pushed.
		if err := c.push(ctx, e, d, m.AccountJWT); err != nil {
			fmt.Fprintf(e.Err, "note: tenant %s's new account is in %s but was not pushed to NATS (%v); a server using that directory as its resolver finds it anyway\n",
				c.tenant, filepath.Join(c.dir, "jwt"), err)
		}
	}
	body := append([]byte(fmt.Sprintf("# agentfleet tenant %s: JetStream API prefix %s (jetstream.NewWithAPIPrefix, nats --js-api-prefix); inbox prefix %s or _INBOX\n",
		c.tenant, tenancy.JSAPIPrefix, tenancy.InboxPrefix(c.tenant))), m.Creds...)
	if c.out == "" {
		_, _ = e.Out.Write(body)
	} else if err := writePrivate(c.out, body); err != nil {
		fmt.Fprintf(e.Err, "dispatcher tenant creds: %v\n", err)
		return ExitFailed
	}
	fmt.Fprintf(e.Err, "tenant %s: JetStream API prefix %s, e.g. nats --creds FILE --js-api-prefix '%s' ...\n",
		c.tenant, tenancy.JSAPIPrefix, tenancy.JSAPIPrefix)
	return ExitOK
}

func (c *tenantAuthCmd) revoke(ctx context.Context, e *Env, d *tenancy.Dir) int {
	accJWT, err := d.Revoke(c.tenant)
	if err != nil {
		fmt.Fprintf(e.Err, "dispatcher tenant revoke: %v\n", err)
		return ExitFailed
	}
	if err := c.push(ctx, e, d, accJWT); err != nil {
		fmt.Fprintf(e.Err, "dispatcher tenant revoke: %s is revoked in %s, but the running server was not told: %v\nrun it again once NATS is reachable (a server restart applies it too)\n",
			c.tenant, c.dir, err)
		return ExitUnavailable
	}
	fmt.Fprintf(e.Out, "revoked every creds file and token of tenant %s; its clients were disconnected\n", c.tenant)
	return ExitOK
}

// push sends an account JWT to the server as the system account user.
func (c *tenantAuthCmd) push(ctx context.Context, e *Env, d *tenancy.Dir, accJWT string) error {
	common := e.Common
	common.NATSCreds, common.InboxPrefix = d.SysCreds(), ""
	nc, err := config.Connect(common, "fleet-cli", e.Log, nats.RetryOnFailedConnect(false), nats.MaxReconnects(0), nats.Timeout(3*time.Second))
	if err != nil {
		return fmt.Errorf("cannot reach NATS at %s: %w", config.RedactURLs(common.NATSURL), err)
	}
	defer nc.Close()
	rctx, cancel := e.Request(ctx)
	defer cancel()
	return tenancy.Push(rctx, nc, accJWT)
}

// writePrivate writes b to path, readable by the owner only.
func writePrivate(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// credsTenant applies tenant creds given with --nats-creds (docs/tenancy.md):
// the command's --tenant defaults to the creds' tenant and may not name
// another, the reply inbox is the tenant's, and JetStream goes through
// its account's API prefix. A missing, malformed or expired creds file is
// a usage error naming which. It runs before the command's Validate, and
// returns false with the exit code when the command must not run.
func credsTenant(fs *pflag.FlagSet, common *config.Common, stderr io.Writer) (apiPrefix string, code int, ok bool) {
	if common.NATSCreds == "" {
		return "", ExitOK, true
	}
	ci, err := tenancy.ReadCreds(common.NATSCreds)
	if err != nil {
		fmt.Fprintf(stderr, "--nats-creds: %v\n", err)
		return "", ExitUsage, false
	}
	if ci.Tenant == "" {
		return "", ExitOK, true
	}
	if f := fs.Lookup("tenant"); f != nil {
		if fs.Changed("tenant") && f.Value.String() != ci.Tenant {
			fmt.Fprintf(stderr, "--tenant %s: these NATS creds are tenant %s's, and reach no other tenant\n", f.Value.String(), ci.Tenant)
			return "", ExitUsage, false
		}
		_ = f.Value.Set(ci.Tenant) // not Changed: ls -A stays allowed (the server scopes it)
	}
	if !fs.Changed("inbox-prefix") {
		common.InboxPrefix = tenancy.InboxPrefix(ci.Tenant)
	}
	return tenancy.JSAPIPrefix, ExitOK, true
}

// credsHint explains a connection refused with creds: NATS says only
// "authorization violation" for revoked creds, and for creds of another
// setup's operator.
func credsHint(creds string, err error) string {
	if creds == "" || !(errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAuthExpired)) {
		return ""
	}
	return fmt.Sprintf(" (NATS refused the creds in %s: revoked with 'dispatcher tenant revoke', or not made for this server)", creds)
}
