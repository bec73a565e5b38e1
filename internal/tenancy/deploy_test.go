package tenancy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/internal/tenancy"
)

// copyConf copies a shipped config to rel under a fresh root, with the
// auth setup at root/auth as the docs make it, and returns the copy's path.
func copyConf(t *testing.T, shipped, rel string) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, tenancy.Init(filepath.Join(root, "auth"), tenancy.InitOptions{}))
	b, err := os.ReadFile(shipped)
	require.NoError(t, err)
	dst := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	require.NoError(t, os.WriteFile(dst, b, 0o600))
	return dst
}

// deploy/nats/nats-jwt.conf runs in the JWT mode: the fleet's admin and a
// tenant connect with their creds; no one connects without.
func TestShippedSingleServerConfig(t *testing.T) {
	conf := copyConf(t, "../../deploy/nats/nats-jwt.conf", "nats-jwt.conf")
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.NotEmpty(t, opts.TrustedOperators)
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir, opts.NoLog, opts.NoSigs = t.TempDir(), true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(time.Minute))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	dir := filepath.Join(filepath.Dir(conf), "auth")
	adm, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(filepath.Join(dir, tenancy.AdminFile)))
	require.NoError(t, err)
	defer adm.Close()
	js, err := adm.JetStream()
	require.NoError(t, err)
	_, err = js.AccountInfo()
	require.NoError(t, err, "FLEET has JetStream")
	d, err := tenancy.Open(dir)
	require.NoError(t, err)
	m, err := d.TenantCreds("acme", 0)
	require.NoError(t, err)
	creds := filepath.Join(t.TempDir(), "acme.creds")
	require.NoError(t, os.WriteFile(creds, m.Creds, 0o600))
	nc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(creds))
	require.NoError(t, err)
	nc.Close()
	_, err = nats.Connect(srv.ClientURL(), nats.MaxReconnects(0))
	require.Error(t, err, "connected with no creds")
}

// deploy/nats/cluster/node-jwt.conf parses in the JWT mode with a node's
// variables.
func TestShippedClusterNodeConfig(t *testing.T) {
	conf := copyConf(t, "../../deploy/nats/cluster/node-jwt.conf", "cluster/node-jwt.conf")
	for k, v := range map[string]string{"FLEET_NATS_NAME": "n1", "FLEET_NATS_HOST": "127.0.0.1", "FLEET_NATS_PORT": "4222",
		"FLEET_NATS_HTTP_PORT": "8222", "FLEET_NATS_CLUSTER_PORT": "6222", "FLEET_NATS_STORE": t.TempDir(),
		"FLEET_NATS_ROUTE_1": "nats-route://127.0.0.1:6222", "FLEET_NATS_ROUTE_2": "nats-route://127.0.0.1:6223", "FLEET_NATS_ROUTE_3": "nats-route://127.0.0.1:6224"} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	// Parsing made the full resolver (no server will run to close it).
	t.Cleanup(opts.AccountResolver.Close)
	require.NotEmpty(t, opts.TrustedOperators)
	require.Equal(t, "fleet", opts.Cluster.Name)
	require.NotEmpty(t, opts.SystemAccount)
}

// The compose files run NATS on the JWT config and the fleet's roles on
// their creds files, with no passwords.
func TestShippedComposeFiles(t *testing.T) {
	// The main compose file mounts the auth directory into the dispatcher
	// (its creds, and the keys that check tenant tokens); the cluster's
	// mounts its creds alone.
	for f, dispatcherCreds := range map[string]string{"../../docker-compose.yml": "/auth/dispatcher.creds", "../../deploy/nats/cluster/compose.yml": "/run/fleet/dispatcher.creds"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NotContains(t, string(b), "PASSWORD", f)
		var c struct {
			Services map[string]struct {
				Command     []string          `yaml:"command"`
				Environment map[string]string `yaml:"environment"`
			} `yaml:"services"`
		}
		require.NoError(t, yaml.Unmarshal(b, &c), f)
		require.Equal(t, dispatcherCreds, c.Services["dispatcher"].Environment["FLEET_NATS_CREDS"], f)
		require.Equal(t, "/run/fleet/worker.creds", c.Services["worker"].Environment["FLEET_NATS_CREDS"], f)
		nats := 0
		for name, s := range c.Services {
			if strings.HasPrefix(name, "nats") {
				nats++
				// A JWT-mode config: a shipped *-jwt.conf, or the nats.conf
				// that scripts/compose-auth.sh writes beside nats-auth.conf.
				cmd := strings.Join(s.Command, " ")
				require.True(t, strings.Contains(cmd, "-jwt.conf") || strings.Contains(cmd, "/auth/nats.conf"), "%s %s: %s", f, name, cmd)
			}
		}
		require.NotZero(t, nats, f)
	}
}
