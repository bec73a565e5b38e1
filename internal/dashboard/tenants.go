package dashboard

import (
	"net/http"
	"strings"
)

// scopeToTenant keeps a tenant's token to its own queries (docs/tenancy.md): the
// fleet page (every tenant's queues and workers) sends it to its queries,
// the query list is filtered to it whatever ?tenant= says, a query page,
// its live events, diff and actions of another tenant are 404 (as if
// absent), and nothing else is served. It reports whether to go on.
func scopeToTenant(w http.ResponseWriter, r *http.Request, tenant string) bool {
	p := r.URL.EscapedPath() // as the mux splits it
	switch {
	case p == "/":
		http.Redirect(w, r, "/queries", http.StatusSeeOther)
		return false
	case p == "/queries":
		q := r.URL.Query()
		q.Set("tenant", tenant)
		r.URL.RawQuery = q.Encode()
		return true
	case strings.HasPrefix(p, "/q/"):
		t, _, _ := strings.Cut(strings.TrimPrefix(p, "/q/"), "/")
		if t == tenant {
			return true
		}
	}
	http.Error(w, "not found", http.StatusNotFound)
	return false
}
