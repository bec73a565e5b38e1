package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Settings are one tenant's admission settings, stored as JSON under the
// tenant's name in the KV bucket FLEET_TENANTS.
type Settings struct {
	// MaxRunning caps the tenant's runs at once; 0 means only the fleet's
	// cap applies.
	MaxRunning int `json:"max_running,omitempty"`
	// Weight is the tenant's share of free slots under backlog (deficit
	// round robin); 0 means the default weight.
	Weight float64 `json:"weight,omitempty"`
	// BudgetUSD stops admission once the results' total_cost_usd in the
	// current BudgetWindow reach it; 0 means no budget.
	BudgetUSD float64 `json:"budget_usd,omitempty"`
	// BudgetWindow is the budget's window, aligned to multiples of it since
	// the Unix epoch (24h windows start at 00:00 UTC).
	BudgetWindow Duration `json:"budget_window,omitempty"`
}

// Duration is a time.Duration that reads and writes JSON as "90s", "24h".
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("admission: duration must be a string like \"24h\": %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("admission: duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Limits of settings.
const (
	MinWeight = 0.01
	MaxWeight = 1000
)

// Validate reports settings no admitter could follow.
func (s Settings) Validate() error {
	switch {
	case math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0):
		return errors.New("admission: weight must be a finite number")
	case math.IsNaN(s.BudgetUSD) || math.IsInf(s.BudgetUSD, 0):
		return errors.New("admission: budget_usd must be a finite number")
	case s.MaxRunning < 0:
		return errors.New("admission: max_running must be 0 (no cap) or more")
	case s.Weight != 0 && (s.Weight < MinWeight || s.Weight > MaxWeight):
		return fmt.Errorf("admission: weight must be between %g and %g", float64(MinWeight), float64(MaxWeight))
	case s.BudgetUSD < 0:
		return errors.New("admission: budget_usd must be 0 (none) or more")
	case s.BudgetUSD > 0 && time.Duration(s.BudgetWindow) < time.Minute:
		return errors.New("admission: a budget needs a budget_window of at least 1m")
	case s.BudgetWindow < 0:
		return errors.New("admission: budget_window must not be negative")
	}
	return nil
}

// Tenant is what the policy knows of one tenant when it decides.
type Tenant struct {
	Name     string
	Settings Settings
	// Running is the tenant's admitted runs not yet finished.
	Running int
	// Spent is the tenant's total_cost_usd in the current budget window.
	Spent float64
	// PausedUntil is the end of a rate-limit pause (zero: none).
	PausedUntil time.Time
}

// Decision is the policy's answer for a tenant's next queued job.
type Decision struct {
	// Admit is true when the job may start now.
	Admit bool
	// Reason says why not (protocol.Reason*), empty when admitted.
	Reason string
}

// Policy decides admission from settings, counts and time.
type Policy struct {
	// Defaults apply to tenants without settings and to the fields a
	// tenant's settings leave zero. Weight defaults to 1.
	Defaults Settings
	// FleetCap is the fleet-wide concurrency (the work consumer's
	// MaxAckPending).
	FleetCap int
}

// Effective merges s over the policy's defaults.
func (p Policy) Effective(s Settings) Settings {
	if s.MaxRunning == 0 {
		s.MaxRunning = p.Defaults.MaxRunning
	}
	if s.Weight == 0 {
		s.Weight = p.Defaults.Weight
	}
	if s.Weight == 0 {
		s.Weight = 1
	}
	if s.BudgetUSD == 0 && p.Defaults.BudgetUSD > 0 {
		s.BudgetUSD, s.BudgetWindow = p.Defaults.BudgetUSD, p.Defaults.BudgetWindow
	}
	return s
}

// Decide says whether tenant t's next queued job may start now, with
// fleetRunning runs in the fleet. The reasons are checked from the longest
// lasting to the shortest: budget, rate_limited, tenant_cap, fleet_cap.
func (p Policy) Decide(t Tenant, fleetRunning int, now time.Time) Decision {
	s := p.Effective(t.Settings)
	switch {
	case s.BudgetUSD > 0 && t.Spent >= s.BudgetUSD:
		return Decision{Reason: protocol.ReasonBudget}
	case now.Before(t.PausedUntil):
		return Decision{Reason: protocol.ReasonRateLimited}
	case s.MaxRunning > 0 && t.Running >= s.MaxRunning:
		return Decision{Reason: protocol.ReasonTenantCap}
	case fleetRunning >= p.FleetCap:
		return Decision{Reason: protocol.ReasonFleetCap}
	}
	return Decision{Admit: true}
}

// WindowStart is the start of the budget window holding now.
func WindowStart(now time.Time, window time.Duration) time.Time {
	if window <= 0 {
		return time.Unix(0, 0).UTC()
	}
	ns := now.UnixNano()
	return time.Unix(0, ns-ns%int64(window)).UTC()
}
