package admission

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	p := Policy{FleetCap: 4, Defaults: Settings{MaxRunning: 3}}
	cases := []struct {
		name   string
		t      Tenant
		fleet  int
		reason string
	}{
		{"room", Tenant{Running: 1}, 1, ""},
		{"default cap", Tenant{Running: 3}, 3, protocol.ReasonTenantCap},
		{"own cap over the default", Tenant{Running: 3, Settings: Settings{MaxRunning: 5}}, 3, ""},
		{"fleet full", Tenant{Running: 0}, 4, protocol.ReasonFleetCap},
		{"budget spent", Tenant{Spent: 2, Settings: Settings{BudgetUSD: 2, BudgetWindow: Duration(time.Hour)}}, 0, protocol.ReasonBudget},
		{"budget left", Tenant{Spent: 1.99, Settings: Settings{BudgetUSD: 2, BudgetWindow: Duration(time.Hour)}}, 0, ""},
		{"paused", Tenant{PausedUntil: now.Add(time.Second)}, 0, protocol.ReasonRateLimited},
		{"pause over", Tenant{PausedUntil: now}, 0, ""},
		{"budget before pause before cap", Tenant{Running: 3, Spent: 5, PausedUntil: now.Add(time.Hour),
			Settings: Settings{BudgetUSD: 1, BudgetWindow: Duration(time.Hour)}}, 4, protocol.ReasonBudget},
		{"pause before cap", Tenant{Running: 3, PausedUntil: now.Add(time.Hour)}, 4, protocol.ReasonRateLimited},
		{"tenant cap before fleet cap", Tenant{Running: 3}, 4, protocol.ReasonTenantCap},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := p.Decide(c.t, c.fleet, now)
			require.Equal(t, c.reason == "", d.Admit)
			require.Equal(t, c.reason, d.Reason)
		})
	}
}

func TestSettingsValidateAndJSON(t *testing.T) {
	t.Parallel()
	for _, bad := range []Settings{
		{MaxRunning: -1}, {Weight: 0.001}, {Weight: 5000}, {BudgetUSD: -1},
		{BudgetUSD: 1}, {BudgetUSD: 1, BudgetWindow: Duration(time.Second)}, {BudgetWindow: -1},
		{Weight: math.NaN()}, {Weight: math.Inf(1)},
		{BudgetUSD: math.NaN(), BudgetWindow: Duration(time.Hour)}, {BudgetUSD: math.Inf(1), BudgetWindow: Duration(time.Hour)},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
	s := Settings{MaxRunning: 2, Weight: 3, BudgetUSD: 10, BudgetWindow: Duration(24 * time.Hour)}
	require.NoError(t, s.Validate())
	b, err := json.Marshal(s)
	require.NoError(t, err)
	require.JSONEq(t, `{"max_running":2,"weight":3,"budget_usd":10,"budget_window":"24h0m0s"}`, string(b))
	got, err := decodeSettings(b)
	require.NoError(t, err)
	require.Equal(t, s, got)
	_, err = decodeSettings([]byte(`{"budget_window":"soon"}`))
	require.Error(t, err)
}

func TestWindowStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 17, 42, 5, 0, time.UTC)
	require.Equal(t, time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC), WindowStart(at, 24*time.Hour))
	require.Equal(t, time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC), WindowStart(at, time.Hour))
	require.Equal(t, WindowStart(at, time.Hour).Add(time.Hour), WindowStart(at.Add(time.Hour), time.Hour), "the next window")
}

// Under backlog, deficit round robin gives starts in proportion to weight.
func TestDRRWeights(t *testing.T) {
	t.Parallel()
	d := newDRR()
	w := map[string]float64{"a": 3, "b": 1, "c": 0.5}
	counts := map[string]int{}
	all := func(string) bool { return true }
	for range 900 {
		counts[d.next([]string{"a", "b", "c"}, all, func(t string) float64 { return w[t] })]++
	}
	require.Equal(t, map[string]int{"a": 600, "b": 200, "c": 100}, counts)
}

// A tenant joining while another has a deep backlog gets a slot within one
// round: at most the other's weight in starts before its first.
func TestDRRNewTenantWaitsAtMostOneRound(t *testing.T) {
	t.Parallel()
	d := newDRR()
	all := func(string) bool { return true }
	one := func(string) float64 { return 1 }
	for range 50 {
		require.Equal(t, "big", d.next([]string{"big"}, all, one))
	}
	require.Equal(t, "small", d.next([]string{"big", "small"}, all, one))
	require.Equal(t, "big", d.next([]string{"big", "small"}, all, one))
}

// Tenants that cannot be admitted are passed over and lose their deficit.
func TestDRRSkipsIneligible(t *testing.T) {
	t.Parallel()
	d := newDRR()
	blocked := map[string]bool{"a": true}
	el := func(t string) bool { return !blocked[t] }
	three := func(string) float64 { return 3 }
	require.Equal(t, "b", d.next([]string{"a", "b"}, el, three))
	blocked["b"] = true
	require.Empty(t, d.next([]string{"a", "b"}, el, three))
	blocked["a"], blocked["b"] = false, false
	got := []string{}
	for range 6 {
		got = append(got, d.next([]string{"a", "b"}, el, three))
	}
	require.Equal(t, []string{"b", "b", "b", "a", "a", "a"}, got, "b had no deficit left over: a fresh quantum from where the ring stopped")
}

func TestRateLimitUntil(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		line string
		hit  bool
		want time.Time
	}{
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1788934800,"rateLimitType":"five_hour"},"session_id":"s"}`, true, time.Unix(1788934800, 0).UTC()},
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected"}}`, true, now.Add(time.Minute)},
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1788934800}}`, false, time.Time{}},
		{`{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1788934800}}`, false, time.Time{}},
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"API Error: 429"}`, true, now.Add(time.Minute)},
		{`{"type":"result","subtype":"success","is_error":true,"api_error_status":404}`, false, time.Time{}},
		{`{"type":"assistant","message":{"model":"<synthetic>"},"error":"rate_limit"}`, true, now.Add(time.Minute)},
		{`{"type":"assistant","message":{"content":[{"type":"text","text":"429 rate_limit"}]}}`, false, time.Time{}},
		{`not json rate_limit`, false, time.Time{}},
	}
	for _, c := range cases {
		got, hit := RateLimitUntil([]byte(c.line), now, time.Minute)
		require.Equal(t, c.hit, hit, c.line)
		require.Equal(t, c.want, got, c.line)
	}
}

func FuzzRateLimitUntil(f *testing.F) {
	f.Add([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1788934800}}`))
	f.Add([]byte(`{"type":"result","api_error_status":429}`))
	f.Add([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1e300}}`))
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, line []byte) {
		until, hit := RateLimitUntil(line, now, time.Minute)
		if hit && until.IsZero() {
			t.Fatal("a pause without an end")
		}
	})
}

// The worker's prefilter never hides a rate limit the admitter would act
// on (for lines without \u escapes, which the CLI does not write).
func FuzzRateLimitPrefilter(f *testing.F) {
	f.Add([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1788934800}}`))
	f.Add([]byte(`{"type":"result","api_error_status":429}`))
	f.Add([]byte(`{"type":"result","API_Error_Status":null,"api_error_status":4.29e2}`))
	f.Add([]byte(`{"type":"assistant","error":"rate_limit"}`))
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.Contains(line, []byte(`\u`)) {
			return
		}
		if _, hit := RateLimitUntil(line, now, time.Minute); hit && len(line) <= protocol.MaxRateLimitLine {
			require.True(t, protocol.MayReportRateLimit(line), "the prefilter drops %q", line)
		}
	})
}

func FuzzDecodeSettings(f *testing.F) {
	f.Add([]byte(`{"max_running":2,"weight":3,"budget_usd":10,"budget_window":"24h"}`))
	f.Add([]byte(`{"budget_window":86400000000000}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSettings(b)
		if err == nil {
			require.NoError(t, s.Validate())
		}
	})
}

// statusState reads the state of every status the fleet encodes, whatever
// its other fields hold, and never panics on other bytes.
func FuzzStatusState(f *testing.F) {
	f.Add("q1", "acme", "succeeded", []byte(`{"state":"`))
	f.Add(`x"state":"queued`, `t\`, "parked", []byte(`"state":"running"`))
	f.Fuzz(func(t *testing.T, id, tenant, state string, raw []byte) {
		_, _ = statusState(raw)
		data, err := json.Marshal(protocol.StatusEvent{ID: id, Tenant: tenant, State: protocol.State(state), Reason: id})
		require.NoError(t, err)
		for _, c := range []byte(state) {
			if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return // json.Marshal escapes it; the fleet's states have none
			}
		}
		got, ok := statusState(data)
		require.True(t, ok, "%s", data)
		require.Equal(t, protocol.State(state), got, "%s", data)
	})
}
