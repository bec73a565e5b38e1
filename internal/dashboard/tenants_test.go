package dashboard

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// A tenant's token (docs/tenancy.md) sees and touches only its own queries; the
// operator's token sees every tenant's; a revoked or foreign token is 401.
func TestTenantTokens(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	dir := filepath.Join(t.TempDir(), "auth")
	require.NoError(t, tenancy.Init(dir, tenancy.InitOptions{}))
	d, err := tenancy.Open(dir)
	require.NoError(t, err)
	q, err := fleetmetrics.New(f.Client, 2)
	require.NoError(t, err)
	h, err := New(Config{Client: f.Client, Queue: q, Token: "operator", Tenants: d.VerifyToken, Status: f.Status, PageSize: 1, Logger: &f.Logger})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, ref := range []protocol.QueryRef{{Tenant: "acme", ID: "mine1"}, {Tenant: "other", ID: "theirs1"}} {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		r, err := f.Client.Submit(ctx, protocol.Job{ID: ref.ID, Tenant: ref.Tenant, Prompt: "p"})
		cancel()
		require.NoError(t, err)
		require.Nil(t, r.Error)
	}
	acme, err := d.Token("acme", 0)
	require.NoError(t, err)
	do := func(method, path, token string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{CheckRedirect: noRedirect}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	fleettest.Eventually(t, wait, func() bool {
		_, mine := do("GET", "/queries?q=mine1", "operator")
		_, theirs := do("GET", "/queries?q=theirs1", "operator")
		return strings.Contains(mine, `href="/q/acme/mine1"`) && strings.Contains(theirs, `href="/q/other/theirs1"`)
	}, "both queries indexed")

	// Pages of the index, a tenant's own only: a search for the other's id
	// finds nothing, a cursor into the other's records is refused, and the
	// fleet's charts (every tenant) are not the tenant's.
	cursor := base64.RawURLEncoding.EncodeToString([]byte(storage.StatusKey("other", "a")))
	for _, path := range []string{"/queries", "/queries?tenant=other", "/queries?tenant=", "/queries?q=mine", "/queries?q=theirs", "/queries?cursor=" + cursor} {
		code, body := do("GET", path, acme)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "theirs1", path)
	}
	_, body := do("GET", "/queries?cursor="+cursor, acme)
	require.Contains(t, body, "not a cursor of this listing")
	code, _ := do("GET", "/fleet.json", acme)
	require.Equal(t, http.StatusNotFound, code, "the fleet's data is the operator's")
	code, body = do("GET", "/fleet.json", "operator")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"tenant":"other"`)
	for _, path := range []string{"/queries", "/queries?tenant=other", "/queries?tenant="} {
		code, body := do("GET", path, acme)
		require.Equal(t, http.StatusOK, code, path)
		require.Contains(t, body, "mine1", path)
		require.NotContains(t, body, "theirs1", path)
	}
	code, _ = do("GET", "/q/acme/mine1", acme)
	require.Equal(t, http.StatusOK, code)
	for _, req := range [][2]string{{"GET", "/q/other/theirs1"}, {"GET", "/q/other/theirs1/events"}, {"GET", "/q/other/theirs1/diff"},
		{"POST", "/q/other/theirs1/cancel"}, {"POST", "/q/other/theirs1/input"}, {"GET", "/q/ot%68er/theirs1"}} {
		code, body := do(req[0], req[1], acme)
		require.Equal(t, http.StatusNotFound, code, req[1])
		require.NotContains(t, body, "theirs1")
	}
	code, _ = do("GET", "/", acme)
	require.Equal(t, http.StatusSeeOther, code, "the fleet page (every tenant) sends a tenant to its queries")
	code, _ = do("GET", "/", "operator")
	require.Equal(t, http.StatusOK, code)

	other, err := tenancy.Open(dir)
	require.NoError(t, err)
	_, err = other.Revoke("acme")
	require.NoError(t, err)
	code, _ = do("GET", "/q/acme/mine1/events", acme)
	require.Equal(t, http.StatusUnauthorized, code, "a revoked token")
	code, _ = do("GET", "/q/acme/mine1/events", "aft1_garbage")
	require.Equal(t, http.StatusUnauthorized, code)
}
