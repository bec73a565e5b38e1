package dashboard

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Chart window: the fleet page's "jobs per minute" and "failures" series
// cover the last chartMinutes minutes, from the latest chartRecords records
// of the status index.
const (
	chartMinutes = 30
	chartRecords = 500
)

// FleetData is GET /fleet.json, what the fleet page draws: the queue and
// workers now, and per minute the queries that ended and those that failed.
type FleetData struct {
	At             time.Time              `json:"at"`
	DesiredWorkers int                    `json:"desired_workers"`
	Workers        []WorkerRow            `json:"workers"`
	Tenants        []TenantRow            `json:"tenants"`
	Minutes        []int64                `json:"minutes"`  // unix seconds of each minute's start
	Finished       []int                  `json:"finished"` // queries that ended in that minute
	Failed         []int                  `json:"failed"`   // of which failed
	Failures       []protocol.StatusEvent `json:"failures"`
	Error          string                 `json:"error,omitempty"`
}

// WorkerRow is one worker on the fleet page.
type WorkerRow struct {
	ID      string              `json:"id"`
	State   string              `json:"state"`
	Slots   int                 `json:"slots"`
	Running []protocol.QueryRef `json:"running"`
	UpSecs  int64               `json:"up_secs"`
	Version string              `json:"version"`
}

// TenantRow is one tenant's queue and spend.
type TenantRow struct {
	Tenant   string  `json:"tenant"`
	Waiting  int     `json:"waiting"`
	Running  int     `json:"running"`
	WaitSecs float64 `json:"wait_secs"` // the oldest waiting job's wait
	SpendUSD float64 `json:"spend_usd"` // total_cost_usd of its ended queries in the window
	Queries  int     `json:"queries"`   // its queries among the records read
}

// fleetJSON serves FleetData; the fleet page polls it (operator only:
// scopeToTenant sends a tenant token nowhere but its own queries).
func (h *Handler) fleetJSON(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := reqCtx(r)
	defer cancel()
	now := time.Now()
	d := FleetData{At: now, Workers: []WorkerRow{}, Tenants: []TenantRow{}, Failures: []protocol.StatusEvent{}}
	snap, err := h.cfg.Queue.Snapshot(ctx)
	if err != nil {
		d.Error = "reading the queue: " + err.Error()
	}
	d.DesiredWorkers = snap.DesiredWorkers
	for _, wi := range snap.Workers {
		row := WorkerRow{ID: wi.ID, State: wi.State, Slots: wi.Slots, Running: []protocol.QueryRef{}, Version: wi.Version}
		if !wi.Started.IsZero() {
			row.UpSecs = int64(now.Sub(wi.Started).Seconds())
		}
		for _, q := range wi.Running {
			row.Running = append(row.Running, protocol.QueryRef{Tenant: q.Tenant, ID: q.ID})
		}
		d.Workers = append(d.Workers, row)
	}
	slices.SortFunc(d.Workers, func(a, b WorkerRow) int { return strings.Compare(a.ID, b.ID) })
	var recs []protocol.StatusEvent
	if rep, err := h.cfg.Client.List(ctx, protocol.ListRequest{Limit: chartRecords}); err == nil && rep.Error == nil {
		recs = rep.Queries
	} else if d.Error == "" && err != nil {
		d.Error = "reading the status index: " + err.Error()
	}
	d.Minutes, d.Finished, d.Failed = perMinute(recs, now)
	d.Tenants = tenantRows(snap, recs)
	for _, q := range recs {
		if q.State == protocol.StateFailed && len(d.Failures) < 10 {
			d.Failures = append(d.Failures, q)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(d)
}

// perMinute buckets the ended records of the last chartMinutes minutes by
// the minute they ended in.
func perMinute(recs []protocol.StatusEvent, now time.Time) (minutes []int64, finished, failed []int) {
	first := now.Truncate(time.Minute).Add(-(chartMinutes - 1) * time.Minute)
	minutes, finished, failed = make([]int64, chartMinutes), make([]int, chartMinutes), make([]int, chartMinutes)
	for i := range minutes {
		minutes[i] = first.Add(time.Duration(i) * time.Minute).Unix()
	}
	for _, q := range recs {
		if !q.State.Terminal() || q.At.Before(first) {
			continue
		}
		i := int(q.At.Sub(first) / time.Minute)
		if i >= chartMinutes {
			i = chartMinutes - 1
		}
		finished[i]++
		if q.State == protocol.StateFailed {
			failed[i]++
		}
	}
	return minutes, finished, failed
}

// tenantRows joins the queue per tenant with each tenant's spend: the
// total_cost_usd of its ended queries among recs (the gateway's metered
// cost when it fronts the model, docs/operations.md).
func tenantRows(snap fleetmetrics.Snapshot, recs []protocol.StatusEvent) []TenantRow {
	by := map[string]*TenantRow{}
	row := func(t string) *TenantRow {
		if by[t] == nil {
			by[t] = &TenantRow{Tenant: t}
		}
		return by[t]
	}
	for t, q := range snap.Tenants {
		r := row(t)
		r.Waiting, r.Running, r.WaitSecs = q.Waiting, q.Running, q.OldestWait.Seconds()
	}
	for _, q := range recs {
		r := row(q.Tenant)
		r.Queries++
		if q.Result != nil {
			r.SpendUSD += q.Result.TotalCostUSD
		}
	}
	rows := make([]TenantRow, 0, len(by))
	for _, r := range by {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b TenantRow) int { return strings.Compare(a.Tenant, b.Tenant) })
	return rows
}
