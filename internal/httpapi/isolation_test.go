package httpapi_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/httpapi"
)

// tokens stands in for tenancy.VerifyToken: the adapter is the same.
func tokens(tok string) (string, error) {
	switch tok {
	case "tok-a":
		return "a", nil
	case "tok-b":
		return "b", nil
	}
	return "", errors.New("unknown token")
}

// jobCounter counts the jobs published on <prefix>.jobs.> from now on
// (none must be enqueued by a refused request).
func jobCounter(t *testing.T, e *env) func() int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := e.f.NC.Subscribe(e.f.Names.JobsWildcard(), func(*nats.Msg) { n.Add(1) })
	require.NoError(t, err)
	require.NoError(t, e.f.NC.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() int64 {
		// A round trip to the server: every job published before it
		// has been delivered to the counter.
		require.NoError(t, e.f.NC.Flush())
		return n.Load()
	}
}

// TestTenantIsolation: a tenant token reaches its own queries only;
// another tenant's id is 404 on every endpoint, a body naming another
// tenant is 403 with nothing enqueued; the operator's token reaches all.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t, httpapi.Auth{OperatorToken: "op-secret", TenantToken: tokens})

	requireErr(t, e.do(http.MethodGet, "/v1/queries", "", "", nil), http.StatusUnauthorized, "unauthorized")
	requireErr(t, e.do(http.MethodGet, "/v1/queries", "wrong", "", nil), http.StatusUnauthorized, "unauthorized")
	requireErr(t, e.do(http.MethodPost, "/v1/queries", "", js, []byte(`{"prompt":"x"}`)), http.StatusUnauthorized, "unauthorized")
	require.Equal(t, http.StatusOK, e.do(http.MethodGet, "/v1/openapi.json", "", "", nil).Status, "openapi.json needs no token")

	a := submit(t, e, "tok-a", `{"id":"a1","prompt":"/standin sleep=10m"}`)
	require.Equal(t, "a", a.Tenant)
	require.Equal(t, "/v1/queries/a1", a.StatusURL)
	submit(t, e, "tok-b", `{"id":"b1","prompt":"hi"}`)
	jobs := jobCounter(t, e)
	requireErr(t, e.do(http.MethodPost, "/v1/queries", "tok-b", js, []byte(`{"id":"x1","tenant":"a","prompt":"hi"}`)), http.StatusForbidden, "forbidden")
	require.Zero(t, jobs(), "nothing enqueued")

	// b cannot see or touch a1, by any route.
	for _, path := range []string{"/v1/queries/a1", "/v1/queries/a1?tenant=a", "/v1/queries/a1/diff"} {
		requireErr(t, e.do(http.MethodGet, path, "tok-b", "", nil), http.StatusNotFound, "not_found")
	}
	requireErr(t, e.do(http.MethodGet, "/v1/queries/a1/events", "tok-b", "", nil), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodPost, "/v1/queries/a1/cancel", "tok-b", "", nil), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodPost, "/v1/queries/a1/input", "tok-b", js, []byte(`{"text":"x"}`)), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodPost, "/v1/queries/a1/end", "tok-b", "", nil), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodPost, "/v1/queries/a1/approvals/r1", "tok-b", js, []byte(`{"allow":true}`)), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodGet, "/v1/queries?tenant=a", "tok-b", "", nil), http.StatusForbidden, "forbidden")
	// The list is served from the status index, which the dispatcher
	// writes in batches: wait for both records, then each tenant sees its
	// own alone.
	fleettest.Eventually(t, wait, func() bool {
		return len(listAll(t, e, "op-secret", "", 10)) == 2
	}, "both queries indexed")
	require.Equal(t, []string{"b/b1"}, ids(listAll(t, e, "tok-b", "", 10)))
	require.Equal(t, []string{"a/a1"}, ids(listAll(t, e, "tok-a", "", 10)))
	ev := getStatus(t, e, "tok-a", "/v1/queries/a1")
	require.False(t, ev.State.Terminal(), "b's attempts changed nothing of a1")

	// The operator reaches every tenant.
	require.Equal(t, []string{"a/a1", "b/b1"}, ids(listAll(t, e, "op-secret", "", 1)))
	getStatus(t, e, "op-secret", "/v1/queries/a1?tenant=a")
	requireErr(t, e.do(http.MethodGet, "/v1/queries/a1", "op-secret", "", nil), http.StatusNotFound, "not_found")
	r := e.do(http.MethodPost, "/v1/queries/a1/cancel?tenant=a", "op-secret", "", nil)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	evs := e.stream("/v1/queries/a1/events", "tok-a", "")
	require.True(t, strings.Contains(string(evs[len(evs)-1].Data), `"state":"cancelled"`))
}

// TestBadInput: each malformed request is 400 with an error body, and
// nothing is enqueued.
func TestBadInput(t *testing.T) {
	e := newEnv(t, httpapi.Auth{})
	jobs := jobCounter(t, e)
	big := `{"prompt":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`
	cases := []struct {
		name, method, path, ctype, body, code string
	}{
		{"wrong content type", "POST", "/v1/queries", "text/plain", `{"prompt":"x"}`, "bad_request"},
		{"no content type", "POST", "/v1/queries", "", `{"prompt":"x"}`, "bad_request"},
		{"malformed JSON", "POST", "/v1/queries", js, `{"prompt":`, "bad_request"},
		{"not an object", "POST", "/v1/queries", js, `["prompt"]`, "bad_request"},
		{"null", "POST", "/v1/queries", js, `null`, "bad_request"},
		{"oversized", "POST", "/v1/queries", js, big, "bad_request"},
		{"empty prompt", "POST", "/v1/queries", js, `{"prompt":""}`, "invalid_job"},
		{"bad id", "POST", "/v1/queries", js, `{"id":"a b","prompt":"x"}`, "invalid_job"},
		{"bad tenant", "POST", "/v1/queries", js, `{"tenant":"A!","prompt":"x"}`, "invalid_job"},
		{"wrong type", "POST", "/v1/queries", js, `{"prompt":"x","options":{"max_turns":"two"}}`, "invalid_job"},
		{"input unknown field", "POST", "/v1/queries/q1/input", js, `{"text":"x","extra":1}`, "bad_request"},
		{"input empty", "POST", "/v1/queries/q1/input", js, `{"text":""}`, "bad_request"},
		{"input wrong content type", "POST", "/v1/queries/q1/input", "text/plain", `{"text":"x"}`, "bad_request"},
		{"approval without allow", "POST", "/v1/queries/q1/approvals/r1", js, `{"message":"x"}`, "bad_request"},
		{"approval unknown field", "POST", "/v1/queries/q1/approvals/r1", js, `{"allow":true,"why":"x"}`, "bad_request"},
		{"cancel with a body", "POST", "/v1/queries/q1/cancel", js, `{"force":true}`, "bad_request"},
		{"bad cursor", "GET", "/v1/queries?cursor=zzz", "", "", "bad_request"},
		{"bad state", "GET", "/v1/queries?state=sleeping", "", "", "bad_request"},
		{"bad limit", "GET", "/v1/queries?limit=0", "", "", "bad_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			requireErr(t, e.do(c.method, c.path, "", c.ctype, body), http.StatusBadRequest, c.code)
		})
	}
	submit(t, e, "", `{"id":"ok1","prompt":"hi"}`)
	requireErr(t, e.do(http.MethodGet, "/v1/queries/ok1/events", "", "", nil, "Last-Event-ID", "x"), http.StatusBadRequest, "bad_request")
	requireErr(t, e.do(http.MethodPost, "/v1/queries", "", js, []byte(`{"id":"ok1","prompt":"hi"}`)), http.StatusConflict, "duplicate")
	resp, err := http.Get(e.srv.URL + "/v1/nothing")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	requireErr(t, reply{Status: resp.StatusCode, Body: b}, http.StatusNotFound, "not_found")
	require.Equal(t, int64(2), jobs(), "only the valid job was enqueued, and its duplicate (JetStream dropped it)")
}

// TestTenantSchedules: a tenant token adds, lists and removes its own
// schedules only; naming another tenant is 403.
func TestTenantSchedules(t *testing.T) {
	e := newEnv(t, httpapi.Auth{OperatorToken: "op-secret", TenantToken: tokens})
	r := e.do(http.MethodPost, "/v1/schedules", "tok-a", js, []byte(`{"name":"mine","spec":{"every":"1h"},"job":{"prompt":"p"}}`))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), `"tenant":"a"`)
	requireErr(t, e.do(http.MethodPost, "/v1/schedules", "tok-a", js, []byte(`{"name":"x","tenant":"b","spec":{"every":"1h"},"job":{"prompt":"p"}}`)), http.StatusForbidden, "forbidden")
	requireErr(t, e.do(http.MethodPost, "/v1/schedules", "tok-a", js, []byte(`{"name":"x","spec":{"every":"1h"},"job":{"prompt":"p","tenant":"b"}}`)), http.StatusForbidden, "forbidden")
	r = e.do(http.MethodGet, "/v1/schedules", "tok-b", "", nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.JSONEq(t, `{"schedules":[]}`, string(r.Body), "b sees none of a's")
	requireErr(t, e.do(http.MethodDelete, "/v1/schedules/mine", "tok-b", "", nil), http.StatusNotFound, "not_found")
	requireErr(t, e.do(http.MethodGet, "/v1/schedules/mine?tenant=a", "tok-b", "", nil), http.StatusNotFound, "not_found")
	r = e.do(http.MethodGet, "/v1/schedules", "op-secret", "", nil)
	require.Contains(t, string(r.Body), `"name":"mine"`, "the operator sees every tenant's")
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/v1/schedules/mine", "tok-a", "", nil).Status)
}
