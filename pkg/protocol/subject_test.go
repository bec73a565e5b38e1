package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	t.Parallel()
	def := NewNames("")
	custom := NewNames("acme-prod.eu")
	tests := []struct {
		name      string
		got, want string
	}{
		{"Prefix default", def.Prefix(), "fleet"},
		{"Prefix zero value", Names{}.Prefix(), "fleet"},
		{"Prefix custom", custom.Prefix(), "acme-prod.eu"},
		{"JobsStream", def.JobsStream(), "FLEET_JOBS"},
		{"JobsStream custom", custom.JobsStream(), "ACME_PROD_EU_JOBS"},
		{"QueriesStream", def.QueriesStream(), "FLEET_QUERIES"},
		{"DLQStream", def.DLQStream(), "FLEET_DLQ"},
		{"AdvisoryStream", def.AdvisoryStream(), "FLEET_ADVISORIES"},
		{"Consumer", def.Consumer(), "workers"},
		{"JobSubject", def.JobSubject("acme"), "fleet.jobs.acme"},
		{"JobSubject custom", custom.JobSubject("t1"), "acme-prod.eu.jobs.t1"},
		{"JobsWildcard", def.JobsWildcard(), "fleet.jobs.>"},
		{"QueryMsg", def.QueryMsg("acme", "q1"), "fleet.query.acme.q1.msg"},
		{"QueryStatus", def.QueryStatus("acme", "q1"), "fleet.query.acme.q1.status"},
		{"QueryCtl", def.QueryCtl("acme", "q1"), "fleet.query.acme.q1.ctl"},
		{"QueryModel", def.QueryModel("acme", "q1"), "fleet.query.acme.q1.model"},
		{"QueryEgress", def.QueryEgress("acme", "q1"), "fleet.query.acme.q1.egress"},
		{"QueryAll", def.QueryAll("acme", "q1"), "fleet.query.acme.q1.>"},
		{"QueriesWildcard", def.QueriesWildcard(), "fleet.query.>"},
		{"StatusWildcard", def.StatusWildcard(), "fleet.query.*.*.status"},
		{"CtlWildcard", def.CtlWildcard(), "fleet.query.*.*.ctl"},
		{"APISubmit", def.APISubmit(), "fleet.api.submit"},
		{"APICancel", def.APICancel(), "fleet.api.cancel"},
		{"APIStatus", def.APIStatus(), "fleet.api.status"},
		{"APIList", def.APIList(), "fleet.api.list"},
		{"DLQ", def.DLQ("acme"), "fleet.dlq.acme"},
		{"DLQWildcard", def.DLQWildcard(), "fleet.dlq.>"},
		{"MaxDeliveriesAdvisory", def.MaxDeliveriesAdvisory(), "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.FLEET_JOBS.workers"},
		{"MaxDeliveriesAdvisory custom", custom.MaxDeliveriesAdvisory(), "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ACME_PROD_EU_JOBS.workers"},
		{"StatusBucket", def.StatusBucket(), "FLEET_STATUS"},
		{"ObjectBucket", def.ObjectBucket(), "FLEET_TRANSCRIPTS"},
		{"QueryMsg custom", custom.QueryMsg("t", "i"), "acme-prod.eu.query.t.i.msg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.got)
		})
	}
}

func TestParseJobSubject(t *testing.T) {
	t.Parallel()
	def, custom := NewNames(""), NewNames("acme-prod.eu")
	tests := []struct {
		name       string
		names      Names
		subject    string
		wantTenant string
		wantField  string // "" = no ValidationError expected (plain ErrInvalidJob)
		wantErr    bool
	}{
		{name: "default", names: def, subject: "fleet.jobs.acme", wantTenant: "acme"},
		{name: "custom prefix", names: custom, subject: "acme-prod.eu.jobs.t_1", wantTenant: "t_1"},
		{name: "round trip", names: def, subject: def.JobSubject("x-9"), wantTenant: "x-9"},
		{name: "other prefix", names: def, subject: "other.jobs.acme", wantErr: true},
		{name: "custom names default subject", names: custom, subject: "fleet.jobs.acme", wantErr: true},
		{name: "no tenant", names: def, subject: "fleet.jobs.", wantErr: true},
		{name: "nested token", names: def, subject: "fleet.jobs.acme.x", wantErr: true},
		{name: "wildcard", names: def, subject: "fleet.jobs.*", wantErr: true, wantField: "subject"},
		{name: "invalid tenant", names: def, subject: "fleet.jobs.Acme", wantErr: true, wantField: "subject"},
		{name: "query subject", names: def, subject: "fleet.query.acme.q1.msg", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tenant, err := tt.names.ParseJobSubject(tt.subject)
			if !tt.wantErr {
				require.NoError(t, err)
				require.Equal(t, tt.wantTenant, tenant)
				return
			}
			require.ErrorIs(t, err, ErrInvalidJob)
			require.Empty(t, tenant)
			if tt.wantField != "" {
				var ve *ValidationError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, tt.wantField, ve.Field)
			}
		})
	}
}

func TestParseQuerySubject(t *testing.T) {
	t.Parallel()
	def, custom := NewNames(""), NewNames("acme-prod.eu")
	tests := []struct {
		name                     string
		names                    Names
		subject                  string
		wantOK                   bool
		wantTenant, wantID, kind string
	}{
		{name: "msg", names: def, subject: def.QueryMsg("acme", "q1"), wantOK: true, wantTenant: "acme", wantID: "q1", kind: "msg"},
		{name: "status", names: def, subject: def.QueryStatus("acme", "Q-2_b"), wantOK: true, wantTenant: "acme", wantID: "Q-2_b", kind: "status"},
		{name: "ctl custom", names: custom, subject: custom.QueryCtl("t", "i"), wantOK: true, wantTenant: "t", wantID: "i", kind: "ctl"},
		{name: "other prefix", names: custom, subject: def.QueryMsg("acme", "q1")},
		{name: "too few tokens", names: def, subject: "fleet.query.acme.q1"},
		{name: "too many tokens", names: def, subject: "fleet.query.acme.q1.msg.x"},
		{name: "empty tenant", names: def, subject: "fleet.query..q1.msg"},
		{name: "empty kind", names: def, subject: "fleet.query.acme.q1."},
		{name: "wildcard tenant", names: def, subject: "fleet.query.*.q1.msg"},
		{name: "wildcard id", names: def, subject: "fleet.query.acme.>.msg"},
		{name: "job subject", names: def, subject: "fleet.jobs.acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tenant, id, kind, ok := tt.names.ParseQuerySubject(tt.subject)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.wantTenant, tenant)
			require.Equal(t, tt.wantID, id)
			require.Equal(t, tt.kind, kind)
		})
	}
}

func TestRateLimitForward(t *testing.T) {
	n := NewNames("")
	require.Equal(t, "fleet.ratelimit.acme", n.RateLimitSubject("acme"))
	tenant, ok := n.ParseRateLimitSubject(n.RateLimitSubject("acme"))
	require.True(t, ok)
	require.Equal(t, "acme", tenant)
	for _, s := range []string{"fleet.ratelimit.", "fleet.ratelimit.a.b", "fleet.work.acme", "other.ratelimit.acme"} {
		_, ok := n.ParseRateLimitSubject(s)
		require.False(t, ok, s)
	}
	require.True(t, MayReportRateLimit([]byte(`{"type":"rate_limit_event","rate_limit_info":{"status":"rejected"}}`)))
	require.True(t, MayReportRateLimit([]byte(`{"type":"result","api_error_status":429}`)))
	require.False(t, MayReportRateLimit([]byte(`{"type":"assistant","message":{"content":[]}}`)))
	require.True(t, MayReportRateLimit([]byte(`{"type":"result","api_error_status": "429"}`)))
	require.True(t, MayReportRateLimit([]byte(`{"type":"assistant","error":"rate_limit"}`)))
	require.False(t, MayReportRateLimit([]byte(`{"type":"result","api_error_status":null,"duration_ms":429}`)), "no API error")
	require.False(t, MayReportRateLimit([]byte(`{"type":"system","session_id":"4290-1429"}`)), "429 in an id")
	big := append([]byte(`{"type":"rate_limit_event","x":"`), make([]byte, MaxRateLimitLine)...)
	require.False(t, MayReportRateLimit(big), "too large to forward as a core message")
}

// The stream-name prefix NewNames makes once is spelled as strings.ToUpper
// of the prefix with "-" and "." replaced, for any prefix.
func FuzzNamesUpper(f *testing.F) {
	for _, p := range []string{"", "fleet", "acme-prod.eu", "Ünï-cödé.x", "a_b-C.9", "\xff"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		want := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(NewNames(p).Prefix()))
		if got := NewNames(p).upper(); got != want {
			t.Fatalf("upper(%q) = %q, want %q", p, got, want)
		}
	})
}
