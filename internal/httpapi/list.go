package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"strconv"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Page sizes of GET /v1/queries.
const (
	DefaultPage = 50
	MaxPage     = 500
	// maxScan bounds the records one page reads when a ?state= or ?q= filter
	// skips most of them; the page then ends early with a next_cursor.
	maxScan = 2000
)

// ListAnswer is GET /v1/queries's body.
type ListAnswer struct {
	Items      []protocol.StatusEvent `json:"items"`
	NextCursor string                 `json:"next_cursor,omitempty"`
}

var states = map[protocol.State]bool{
	protocol.StateQueued: true, protocol.StateRunning: true, protocol.StateRetrying: true,
	protocol.StateSucceeded: true, protocol.StateFailed: true, protocol.StateCancelled: true,
	protocol.StateIdle: true, protocol.StateAwaitingApproval: true, protocol.StateParked: true,
}

// list pages the status index: the status store's keys
// (status/<tenant>/<id>.json, sorted), from the key after the cursor. It
// reads the records of the page only (and those a state filter skips, at
// most maxScan), never the whole index.
func (a *API) list(w http.ResponseWriter, r *http.Request, p Principal) {
	q := r.URL.Query()
	tenant := q.Get("tenant")
	switch {
	case tenant != "" && !protocol.ValidTenant(tenant):
		writeError(w, http.StatusBadRequest, CodeBadRequest, "tenant: must match "+protocol.TenantPattern)
		return
	case !p.Operator && tenant != "" && tenant != p.Tenant:
		writeError(w, http.StatusForbidden, CodeForbidden, errForbidden.Error())
		return
	case !p.Operator:
		tenant = p.Tenant
	}
	state := protocol.State(q.Get("state"))
	if state != "" && !states[state] {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "state: not a query state: "+string(state))
		return
	}
	search := q.Get("q")
	if len(search) > MaxQuery {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "q: longer than "+strconv.Itoa(MaxQuery)+" bytes")
		return
	}
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	prefix := storage.StatusPrefix(tenant)
	after, err := decodeCursor(q.Get("cursor"), prefix)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	ans, err := page(ctx, a.cfg.Status, prefix, after, filter{state: state, q: search}, limit)
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeInternal, "reading the status index: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// filter is a list's ?state= and ?q=.
type filter struct {
	state protocol.State
	q     string
}

// ListIndex pages the status index as GET /v1/queries does: tenant's
// records ("" every tenant) after cursor (a NextCursor of the same
// listing, "" from the start), those in state (when set) that match q
// (Matches), at most limit. A cursor of another listing is an error.
func ListIndex(ctx context.Context, status storage.Store, tenant, cursor string, state protocol.State, q string, limit int) (ListAnswer, error) {
	prefix := storage.StatusPrefix(tenant)
	after, err := decodeCursor(cursor, prefix)
	if err != nil {
		return ListAnswer{}, err
	}
	return page(ctx, status, prefix, after, filter{state: state, q: q}, min(max(limit, 1), MaxPage))
}

func page(ctx context.Context, status storage.Store, prefix, after string, f filter, limit int) (ListAnswer, error) {
	keys, err := status.List(ctx, prefix)
	if err != nil {
		return ListAnswer{}, err
	}
	i := sort.SearchStrings(keys, after)
	if i < len(keys) && keys[i] == after {
		i++
	}
	ans := ListAnswer{Items: []protocol.StatusEvent{}}
	scanned := 0
	for ; i < len(keys) && len(ans.Items) < limit && scanned < maxScan; i++ {
		scanned++
		raw, err := status.Get(ctx, keys[i])
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return ListAnswer{}, err
		}
		var ev protocol.StatusEvent
		if json.Unmarshal(raw, &ev) != nil || (f.state != "" && ev.State != f.state) || !Matches(ev, f.q) {
			continue
		}
		ans.Items = append(ans.Items, ev)
	}
	if i < len(keys) {
		ans.NextCursor = encodeCursor(keys[i-1])
	}
	return ans, nil
}
