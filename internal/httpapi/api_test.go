package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/httpapi"
	"github.com/agentfleet/agentfleet/internal/jsconsumer"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

const js = "application/json"

// replay reads a query from FLEET_QUERIES with an ordered consumer, as the
// events a client should get: lines as "message" with their Fleet-Seq,
// statuses as "status".
func replay(t *testing.T, e *env, tenant, id string) []sseEvent {
	t.Helper()
	f := e.f
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cons, err := jsconsumer.Ordered(ctx, f.JS, f.Names.QueriesStream(), f.Names.QueryAll(tenant, id))
	require.NoError(t, err)
	defer jsconsumer.Release(f.JS, f.Names.QueriesStream(), cons)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	var out []sseEvent
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 500)), jetstream.FetchMaxWait(wait))
		require.NoError(t, err)
		for m := range batch.Messages() {
			left--
			switch m.Subject() {
			case f.Names.QueryMsg(tenant, id):
				out = append(out, sseEvent{Name: "message", ID: m.Headers().Get(protocol.HeaderSeq), Data: m.Data()})
			case f.Names.QueryStatus(tenant, id):
				var ev protocol.StatusEvent
				require.NoError(t, json.Unmarshal(m.Data(), &ev))
				b, err := json.Marshal(ev)
				require.NoError(t, err)
				out = append(out, sseEvent{Name: "status", Data: b})
			case f.Names.QueryModel(tenant, id):
				out = append(out, sseEvent{Name: "model", Data: m.Data()})
			}
		}
		require.NoError(t, batch.Error())
	}
	return out
}

func submit(t *testing.T, e *env, token, body string) httpapi.SubmitAnswer {
	t.Helper()
	r := e.do(http.MethodPost, "/v1/queries", token, js, []byte(body))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	var a httpapi.SubmitAnswer
	require.NoError(t, json.Unmarshal(r.Body, &a))
	require.Equal(t, a.StatusURL, r.Header.Get("Location"))
	// A GET of the id answers from then on.
	g := e.do(http.MethodGet, a.StatusURL, token, "", nil)
	require.Equal(t, http.StatusOK, g.Status, "%s", g.Body)
	return a
}

func getStatus(t *testing.T, e *env, token, path string) protocol.StatusEvent {
	t.Helper()
	r := e.do(http.MethodGet, path, token, "", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var ev protocol.StatusEvent
	require.NoError(t, json.Unmarshal(r.Body, &ev))
	return ev
}

// waitState polls GET until the query's status satisfies ok (the API has
// no push but SSE, which the tests check on their own).
func waitState(t *testing.T, e *env, token, path string, what string, ok func(protocol.StatusEvent) bool) protocol.StatusEvent {
	t.Helper()
	var ev protocol.StatusEvent
	fleettest.Eventually(t, wait, func() bool {
		ev = getStatus(t, e, token, path)
		return ok(ev)
	}, what)
	return ev
}

func listAll(t *testing.T, e *env, token, query string, limit int) []protocol.StatusEvent {
	t.Helper()
	var all []protocol.StatusEvent
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100)
		path := "/v1/queries?limit=" + strconv.Itoa(limit) + query
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := e.do(http.MethodGet, path, token, "", nil)
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		var page httpapi.ListAnswer
		require.NoError(t, json.Unmarshal(r.Body, &page))
		require.LessOrEqual(t, len(page.Items), limit)
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
}

func ids(evs []protocol.StatusEvent) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.Tenant+"/"+ev.ID)
	}
	slices.Sort(out)
	return out
}

// TestAPI runs every endpoint against a real fleet, with loopback open (no
// token configured), and checks that each documented operation was
// answered and each answer matched the document.
func TestAPI(t *testing.T) {
	e := newEnv(t, httpapi.Auth{})

	t.Run("submit and follow over SSE, replay and resume", func(t *testing.T) {
		a := submit(t, e, "", `{"id":"h1","prompt":"/standin lines=6","metadata":{"ci":"yes"}}`)
		require.Equal(t, httpapi.SubmitAnswer{ID: "h1", Tenant: "default", StatusURL: "/v1/queries/h1", EventsURL: "/v1/queries/h1/events"}, a)
		got := e.stream(a.EventsURL, "", "")
		want := replay(t, e, "default", "h1")
		require.Equal(t, want, got, "the events are the stream's, in its order")
		require.GreaterOrEqual(t, len(got), 9)
		last := got[len(got)-1]
		require.Equal(t, "status", last.Name)
		require.Contains(t, string(last.Data), `"state":"succeeded"`)
		// Resume after line 4: everything after it, nothing before.
		i := slices.IndexFunc(want, func(ev sseEvent) bool { return ev.ID == "4" })
		require.Positive(t, i)
		require.Equal(t, want[i+1:], e.stream(a.EventsURL, "", "4"))
		ev := getStatus(t, e, "", a.StatusURL)
		require.Equal(t, protocol.StateSucceeded, ev.State)
		require.Equal(t, "yes", ev.Metadata["ci"])
	})

	t.Run("a live stream dropped and resumed misses nothing", func(t *testing.T) {
		a := submit(t, e, "", `{"id":"live1","prompt":"/standin lines=12 delay=30ms"}`)
		first := e.streamUntil(a.EventsURL, "5")
		require.Equal(t, "5", first[len(first)-1].ID)
		rest := e.stream(a.EventsURL, "", "5")
		require.Equal(t, replay(t, e, "default", "live1"), append(first, rest...))
	})

	t.Run("an id is assigned, other tenants for the operator, list pages", func(t *testing.T) {
		a := submit(t, e, "", `{"prompt":"hi"}`)
		require.NotEmpty(t, a.ID)
		o := submit(t, e, "", `{"id":"o1","tenant":"other","prompt":"hi"}`)
		require.Equal(t, "/v1/queries/o1?tenant=other", o.StatusURL)
		for i := range 5 {
			submit(t, e, "", `{"id":"p`+strconv.Itoa(i)+`","prompt":"hi"}`)
		}
		want := []string{"default/" + a.ID, "default/h1", "default/live1", "default/p0", "default/p1", "default/p2", "default/p3", "default/p4", "other/o1"}
		slices.Sort(want)
		// The index is written a moment after each status (the dispatcher
		// batches its writes).
		fleettest.Eventually(t, wait, func() bool { return slices.Equal(want, ids(listAll(t, e, "", "", 2))) }, "every query listed, each once")
		keys, err := e.f.Status.List(context.Background(), storage.StatusPrefix(""))
		require.NoError(t, err)
		require.Len(t, keys, len(want))
		require.Equal(t, []string{"other/o1"}, ids(listAll(t, e, "", "&tenant=other", 3)))
		waitState(t, e, "", "/v1/queries/p4", "p4 ends", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
		for _, ev := range listAll(t, e, "", "&state=succeeded", 1) {
			require.Equal(t, protocol.StateSucceeded, ev.State)
		}
	})

	t.Run("model calls are events", func(t *testing.T) {
		a := submit(t, e, "", `{"id":"m1","prompt":"/standin sleep=10m"}`)
		waitState(t, e, "", a.StatusURL, "m1 running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
		call := []byte(`{"call":1,"attempt":1,"model":"claude-test","input_tokens":10,"output_tokens":5,"cost_usd":0.0125,"status":200,"ms":1234}`)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err := e.f.JS.Publish(ctx, e.f.Names.QueryModel("default", "m1"), call)
		require.NoError(t, err)
		r := e.do(http.MethodPost, "/v1/queries/m1/cancel", "", "", nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		got := e.stream(a.EventsURL, "", "")
		i := slices.IndexFunc(got, func(ev sseEvent) bool { return ev.Name == "model" })
		require.GreaterOrEqual(t, i, 0, "a model event")
		require.JSONEq(t, string(call), string(got[i].Data))
		require.Equal(t, replay(t, e, "default", "m1"), got, "in the stream's order")
	})

	t.Run("search by id, prompt and metadata", func(t *testing.T) {
		submit(t, e, "", `{"id":"find-me-7","prompt":"hi","metadata":{"ci":"Run-42"}}`)
		submit(t, e, "", `{"id":"other-8","prompt":"hi","metadata":{"ci":"run-43"}}`)
		submit(t, e, "", `{"id":"by-text-9","prompt":"Please refactor the Billing module"}`)
		fleettest.Eventually(t, wait, func() bool {
			return slices.Equal([]string{"default/by-text-9"}, ids(listAll(t, e, "", "&q=billing+MODULE", 1)))
		}, "prompt text found, case-insensitive, after its run ended")
		fleettest.Eventually(t, wait, func() bool {
			return slices.Equal([]string{"default/find-me-7"}, ids(listAll(t, e, "", "&q=RUN-42", 1)))
		}, "metadata value found, case-insensitive")
		require.Equal(t, []string{"default/find-me-7"}, ids(listAll(t, e, "", "&q=me-7", 2)))
		require.Empty(t, listAll(t, e, "", "&q=nothing-like-it", 2))
		r := e.do(http.MethodGet, "/v1/queries?q="+strings.Repeat("x", httpapi.MaxQuery+1), "", "", nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	})

	t.Run("cancel", func(t *testing.T) {
		a := submit(t, e, "", `{"id":"c1","prompt":"/standin sleep=10m"}`)
		waitState(t, e, "", a.StatusURL, "c1 running", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateRunning })
		r := e.do(http.MethodPost, "/v1/queries/c1/cancel", "", "", nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		evs := e.stream(a.EventsURL, "", "")
		require.Contains(t, string(evs[len(evs)-1].Data), `"state":"cancelled"`)
		requireErr(t, e.do(http.MethodPost, "/v1/queries/c1/cancel", "", js, []byte(`{}`)), http.StatusConflict, "already_finished")
		requireErr(t, e.do(http.MethodPost, "/v1/queries/nope/cancel", "", "", nil), http.StatusNotFound, "not_found")
	})

	t.Run("session: input, approvals, end", func(t *testing.T) {
		a := submit(t, e, "", `{"id":"s1","prompt":"hello","session":{"approvals":"remote"}}`)
		idle := func(turn int) func(protocol.StatusEvent) bool {
			return func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateIdle && ev.Turn == turn }
		}
		waitState(t, e, "", a.StatusURL, "idle after turn 1", idle(1))
		r := e.do(http.MethodPost, "/v1/queries/s1/input", "", js, []byte(`{"text":"/standin ask=Bash"}`))
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		ev := waitState(t, e, "", a.StatusURL, "awaiting approval", func(ev protocol.StatusEvent) bool { return ev.State == protocol.StateAwaitingApproval })
		require.Equal(t, "Bash", ev.ToolName)
		r = e.do(http.MethodPost, "/v1/queries/s1/approvals/"+ev.RequestID, "", js, []byte(`{"allow":false,"message":"not today"}`))
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		waitState(t, e, "", a.StatusURL, "idle after turn 2", idle(2))
		r = e.do(http.MethodPost, "/v1/queries/s1/end", "", "", nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		evs := e.stream(a.EventsURL, "", "")
		require.Contains(t, string(evs[len(evs)-1].Data), `"state":"succeeded"`)
		var text strings.Builder
		for _, ev := range evs {
			text.Write(ev.Data)
		}
		require.Contains(t, text.String(), "permissions: Bash deny: not today", "the answer reached the agent")
		requireErr(t, e.do(http.MethodPost, "/v1/queries/s1/input", "", js, []byte(`{"text":"more"}`)), http.StatusConflict, "already_finished")
	})

	t.Run("diff", func(t *testing.T) {
		requireErr(t, e.do(http.MethodGet, "/v1/queries/h1/diff", "", "", nil), http.StatusNotFound, "not_found")
		patch := "diff --git a/x b/x\n+stand-in edit\n"
		require.NoError(t, e.f.Objects.Put(context.Background(), storage.DiffKey("default", "h1"), []byte(patch)))
		r := e.do(http.MethodGet, "/v1/queries/h1/diff", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, patch, string(r.Body))
	})

	t.Run("schedules", func(t *testing.T) {
		r := e.do(http.MethodPost, "/v1/schedules", "", js, []byte(`{"name":"nightly","tenant":"acme","spec":{"cron":"0 0 2 * * *","tz":"Europe/Paris"},"job":{"prompt":"update"}}`))
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		require.Contains(t, string(r.Body), `"spec":"0 0 2 * * * Europe/Paris"`)
		require.Contains(t, string(r.Body), `"next":`)
		requireErr(t, e.do(http.MethodPost, "/v1/schedules", "", js, []byte(`{"name":"nightly","tenant":"acme","spec":{"every":"1h"},"job":{"prompt":"x"}}`)), http.StatusConflict, "exists")
		requireErr(t, e.do(http.MethodPost, "/v1/schedules", "", js, []byte(`{"name":"bad","spec":{"cron":"0 0 2 * *"},"job":{"prompt":"x"}}`)), http.StatusBadRequest, "invalid_job")
		requireErr(t, e.do(http.MethodPost, "/v1/schedules", "", js, []byte(`{"name":"bad","spec":{"every":"1h"},"job":{"prompt":"x"},"colour":1}`)), http.StatusBadRequest, "bad_request")
		r = e.do(http.MethodGet, "/v1/schedules", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.Contains(t, string(r.Body), `"name":"nightly"`)
		r = e.do(http.MethodGet, "/v1/schedules/nightly?tenant=acme", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		r = e.do(http.MethodPost, "/v1/schedules/nightly/pause?tenant=acme", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.Contains(t, string(r.Body), `"paused":true`)
		r = e.do(http.MethodPost, "/v1/schedules/nightly/resume?tenant=acme", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.NotContains(t, string(r.Body), `"paused":true`)
		require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/v1/schedules/nightly?tenant=acme", "", "", nil).Status)
		requireErr(t, e.do(http.MethodGet, "/v1/schedules/nightly?tenant=acme", "", "", nil), http.StatusNotFound, "not_found")
	})

	t.Run("openapi.json", func(t *testing.T) {
		r := e.do(http.MethodGet, "/v1/openapi.json", "", "", nil)
		require.Equal(t, http.StatusOK, r.Status)
		require.JSONEq(t, string(httpapi.OpenAPI), string(r.Body))
	})

	t.Run("every documented operation was answered", func(t *testing.T) {
		var doc struct {
			Paths map[string]map[string]json.RawMessage `json:"paths"`
		}
		require.NoError(t, json.Unmarshal(httpapi.OpenAPI, &doc))
		for path, ops := range doc.Paths {
			for method := range ops {
				if method == "parameters" {
					continue
				}
				require.True(t, e.seen[strings.ToUpper(method)+" "+path], "%s %s was exercised", method, path)
			}
		}
	})
}
