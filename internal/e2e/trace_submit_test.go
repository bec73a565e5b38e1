package e2e

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/httpapi"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/tracing"
	"github.com/agentfleet/agentfleet/pkg/tracing/tracingtest"
)

// TestTraceOfAV1Submit: POST /v1/queries passes the request's traceparent
// on to the job (over fleet.api.submit's NATS headers, and in-process):
// the worker's fleet.attempt and the admitter's fleet.admit are spans of
// that trace under the producer's span, and every status, queued
// included, carries its trace id. Without one (or with a malformed one)
// the dispatcher starts the trace with a root fleet.submit span.
func TestTraceOfAV1Submit(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.New(t)
	start := func(service string) *tracing.Tracing {
		tr, err := tracing.StartEndpoint(context.Background(), service, rcv.URL, zerolog.Nop())
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
		return tr
	}
	dtr, wtr := start("fleet-dispatcher"), start("fleet-worker")
	f := fleettest.New(t, fleettest.Opts{Tracing: dtr})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2, Mod: func(c *worker.Config) { c.Tracing = wtr }}).W)
	serve := func(c *fleetapi.Client) string {
		api, err := httpapi.New(httpapi.Config{Client: c, Status: f.Status, Objects: f.Objects, Auth: httpapi.Auth{}, Logger: &f.Logger})
		require.NoError(t, err)
		srv := httptest.NewServer(httpapi.Mount(api, nil))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	overNATS, local := serve(f.Client), serve(&fleetapi.Client{NC: f.Client.NC, JS: f.Client.JS, Names: f.Names, Local: f.Disp.Local()})
	post := func(base, id, traceparent string) fleettest.Run {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/queries", bytes.NewReader([]byte(`{"id":"`+id+`","prompt":"hello"}`)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
			req.Header.Set("tracestate", "vendor=1")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		r := f.Follow("default", id, wait)
		require.Equal(t, protocol.StateSucceeded, r.Final.State)
		for _, ev := range r.Statuses {
			require.Equal(t, r.Final.TraceID, ev.TraceID, "status %s of %s", ev.State, id)
		}
		require.Len(t, r.Final.TraceID, 32)
		return r
	}
	spans := func(traceID string, names ...string) map[string]tracingtest.Span {
		byName := map[string]tracingtest.Span{}
		fleettest.Eventually(t, wait, func() bool {
			require.NoError(t, wtr.ForceFlush(context.Background()))
			require.NoError(t, dtr.ForceFlush(context.Background()))
			for _, s := range rcv.Spans() {
				if s.TraceID == traceID {
					byName[s.Name] = s
				}
			}
			for _, n := range names {
				if _, ok := byName[n]; !ok {
					return false
				}
			}
			return true
		}, "the spans of trace "+traceID)
		return byName
	}

	const parentID = "00f067aa0ba902b7"
	for i, base := range []string{overNATS, local} {
		traceID := []string{"4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737"}[i]
		id := []string{"v1-nats", "v1-local"}[i]
		r := post(base, id, "00-"+traceID+"-"+parentID+"-01")
		require.Equal(t, traceID, r.Final.TraceID, id)
		byName := spans(traceID, "fleet.attempt", "fleet.admit")
		require.Equal(t, parentID, byName["fleet.attempt"].ParentID, id)
		require.Equal(t, id, byName["fleet.attempt"].Attrs["fleet.query.id"])
		require.Equal(t, parentID, byName["fleet.admit"].ParentID, id)
		require.Equal(t, "default", byName["fleet.admit"].Attrs["fleet.tenant"])
		require.Contains(t, byName["fleet.admit"].Attrs, "fleet.admission.wait_ms")
		require.NotContains(t, byName, "fleet.submit", "the producer's trace is kept as it is")
	}

	for _, tc := range []struct{ id, traceparent string }{{"v1-none", ""}, {"v1-bad", "00-4bf92f3577b34da6a3ce929d0e0e4736-zz-01"}} {
		r := post(overNATS, tc.id, tc.traceparent)
		require.NotEqual(t, "4bf92f3577b34da6a3ce929d0e0e4736", r.Final.TraceID)
		byName := spans(r.Final.TraceID, "fleet.submit", "fleet.admit", "fleet.attempt")
		root := byName["fleet.submit"]
		require.Empty(t, root.ParentID, "the dispatcher starts the trace")
		require.Equal(t, tc.id, root.Attrs["fleet.query.id"])
		require.Equal(t, root.SpanID, byName["fleet.attempt"].ParentID)
		require.Equal(t, root.SpanID, byName["fleet.admit"].ParentID)
	}
}

// TestTraceOfAnAdmissionWait: a traced job held behind a full fleet has a
// fleet.admit span in its trace saying why it waited.
func TestTraceOfAnAdmissionWait(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.New(t)
	dtr, err := tracing.StartEndpoint(context.Background(), "fleet-dispatcher", rcv.URL, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = dtr.Shutdown(context.Background()) })
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 1, Tracing: dtr})
	log := watchStatuses(t, f.NC, f.Names)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	f.SubmitJSON("default", "busy", "/standin sleep=1h")
	log.waitFor(t, "busy running", func(ev protocol.StatusEvent) bool {
		return ev.ID == "busy" && ev.State == protocol.StateRunning
	})
	const traceID, parentID = "6bf92f3577b34da6a3ce929d0e0e4738", "00f067aa0ba902b7"
	ctx, ok := tracing.WithTraceparent(context.Background(), "00-"+traceID+"-"+parentID+"-01", "")
	require.True(t, ok)
	rep, err := f.Client.Submit(ctx, protocol.Job{ID: "waits", Tenant: "default", Prompt: "hello"})
	require.NoError(t, err)
	require.Nil(t, rep.Error)
	log.waitFor(t, "waits held behind the full fleet", func(ev protocol.StatusEvent) bool {
		return ev.ID == "waits" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonFleetCap
	})
	sendCtl(t, f, "default", "busy", protocol.CtlOp{Op: protocol.OpCancel})
	r := f.Follow("default", "waits", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, traceID, r.Final.TraceID)

	var admit tracingtest.Span
	fleettest.Eventually(t, wait, func() bool {
		require.NoError(t, dtr.ForceFlush(context.Background()))
		for _, s := range rcv.Spans() {
			if s.TraceID == traceID && s.Name == "fleet.admit" {
				admit = s
				return true
			}
		}
		return false
	}, "the admission's span")
	require.Equal(t, parentID, admit.ParentID)
	require.Equal(t, protocol.ReasonFleetCap, admit.Attrs["fleet.admission.reason"])
	require.Equal(t, "default", admit.Attrs["fleet.tenant"])
}
