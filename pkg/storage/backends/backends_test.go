package backends_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/pkg/storage"
	"github.com/agentfleet/agentfleet/pkg/storage/backends"
	"github.com/agentfleet/agentfleet/pkg/storage/natsstore"
	"github.com/agentfleet/agentfleet/pkg/storage/storagetest"
)

// See pkg/storage/natsstore TestMain for why this nats.go goroutine is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

func TestFilePath(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"file://./data":              "data",
		"file://./data/sub/":         "data/sub",
		"file://data":                "data",
		"file:///var/lib/fleet":      "/var/lib/fleet",
		"file://localhost/var/fleet": "/var/fleet",
		"file:rel/dir":               "rel/dir",
		"file://../up":               "../up",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		got, err := backends.FilePath(u)
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for _, raw := range []string{"file://", "file:///dir?x=1"} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		_, err = backends.FilePath(u)
		require.Error(t, err, raw)
	}
}

func TestOpenFileAbsoluteServesBothRoles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "fleet")
	ctx := t.Context()
	objects, status, err := backends.OpenBoth(ctx, "file://"+dir, "", backends.Deps{})
	require.NoError(t, err)
	require.IsType(t, &storage.FS{}, objects)
	require.IsType(t, &storage.FS{}, status)
	require.NoError(t, status.Put(ctx, storage.StatusKey("t", "q"), []byte("{}")))
	_, err = os.Stat(filepath.Join(dir, "status", "t", "q.json"))
	require.NoError(t, err)
	v, err := objects.Get(ctx, storage.StatusKey("t", "q"))
	require.NoError(t, err, "both roles share the directory")
	require.Equal(t, []byte("{}"), v)
}

func TestOpenFileRelative(t *testing.T) {
	// Not parallel: changes the working directory.
	dir := t.TempDir()
	t.Chdir(dir)
	s, err := backends.Open(t.Context(), "file://./data", backends.Objects, backends.Deps{})
	require.NoError(t, err)
	require.Equal(t, "data", s.(*storage.FS).Root())
	require.NoError(t, s.Put(t.Context(), "k", []byte("v")))
	_, err = os.Stat(filepath.Join(dir, "data", "k"))
	require.NoError(t, err)
}

func TestOpenNATSByRole(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.RunJetStream(t)
	ctx := t.Context()
	deps := backends.Deps{JS: js, StatusBucket: "ST", ObjectBucket: "OB"}

	status, err := backends.Open(ctx, "nats://", backends.Status, deps)
	require.NoError(t, err)
	require.IsType(t, &natsstore.KV{}, status)
	require.Equal(t, "ST", status.(*natsstore.KV).Bucket())

	objects, err := backends.Open(ctx, "nats://", backends.Objects, deps)
	require.NoError(t, err)
	require.IsType(t, &natsstore.Objects{}, objects)
	require.Equal(t, "OB", objects.(*natsstore.Objects).Bucket())

	custom, err := backends.Open(ctx, "nats://?bucket=OTHER", backends.Objects, deps)
	require.NoError(t, err)
	require.Equal(t, "OTHER", custom.(*natsstore.Objects).Bucket())

	def, err := backends.Open(ctx, "nats://", backends.Status, backends.Deps{JS: js})
	require.NoError(t, err)
	require.Equal(t, "FLEET_STATUS", def.(*natsstore.KV).Bucket())
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for raw, want := range map[string]string{
		"ftp://host/x":             `unknown scheme "ftp"`,
		"s3x://bucket":             "known schemes: ",
		"./data":                   "has no scheme",
		"nats://":                  "needs a JetStream connection",
		"nats://otherhost:4222":    "fleet's own NATS connection",
		"nats://?bucket=B&x=1":     `unknown query parameter "x"`,
		"nats://?replicas=0":       `replicas="0": want a number from 1 to 5`,
		"nats://?replicas=three":   `replicas="three": want a number from 1 to 5`,
		"nats://?replicas=6":       `replicas="6"`,
		"file://":                  "names no directory",
		"%zz":                      "bad URL",
		"s3://user:secret@b/%zz":   "bad URL",
		"ftp://user:secret@host/x": "user:xxxxx@host",
	} {
		_, err := backends.Open(ctx, raw, backends.Objects, backends.Deps{})
		require.ErrorContains(t, err, want, raw)
		require.NotContains(t, err.Error(), "secret", "credentials never appear in errors")
	}
	_, err := backends.Open(ctx, "file:///tmp", backends.Role(9), backends.Deps{})
	require.ErrorContains(t, err, "invalid role")
}

// registerRuns numbers TestRegisterAddsScheme's runs.
var registerRuns atomic.Int32

func TestRegisterAddsScheme(t *testing.T) {
	t.Parallel()
	mem := storagetest.NewMem()
	var gotURL *url.URL
	var gotRole backends.Role
	// A scheme of its own per run: the registry is the process's, and
	// -count=N runs this test N times in one process.
	scheme := "memtest" + strconv.Itoa(int(registerRuns.Add(1)))
	backends.Register(scheme, func(_ context.Context, u *url.URL, role backends.Role, _ backends.Deps) (storage.Store, error) {
		gotURL, gotRole = u, role
		return mem, nil
	})
	require.Contains(t, backends.Schemes(), scheme)
	s, err := backends.Open(t.Context(), scheme+"://acct/ns?endpoint=http://x", backends.Status, backends.Deps{})
	require.NoError(t, err)
	require.Same(t, mem, s)
	require.Equal(t, "acct", gotURL.Host)
	require.Equal(t, "http://x", gotURL.Query().Get("endpoint"))
	require.Equal(t, backends.Status, gotRole)

	require.Panics(t, func() {
		backends.Register(scheme, func(context.Context, *url.URL, backends.Role, backends.Deps) (storage.Store, error) { return nil, nil })
	})
	require.Panics(t, func() { backends.Register("nilfn", nil) })
}

func TestOpenBothClosesFirstOnFailure(t *testing.T) {
	t.Parallel()
	_, _, err := backends.OpenBoth(t.Context(), "file://"+t.TempDir(), "bogus://x", backends.Deps{})
	require.ErrorContains(t, err, `unknown scheme "bogus"`)
}

func TestRoleString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "objects", backends.Objects.String())
	require.Equal(t, "status", backends.Status.String())
}

// FuzzOpenNATSURL: any nats:// URL from a flag or the environment gets an
// error, never a panic; with no JetStream connection none can open.
func FuzzOpenNATSURL(f *testing.F) {
	for _, s := range []string{"", "?bucket=B", "?bucket=", "?bucket=B&x=1", "h:1/p?%zz", "/?bucket=a.b", "?replicas=3", "?replicas=-1&bucket=B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rest string) {
		s, err := backends.Open(context.Background(), "nats://"+rest, backends.Status, backends.Deps{})
		require.Error(t, err)
		require.Nil(t, s)
	})
}
