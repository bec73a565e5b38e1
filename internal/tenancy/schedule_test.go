package tenancy_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/internal/trigger"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TestTenantSchedulesAndTriggersAreScoped: on the JWT set-up, a tenant's
// creds add, list and remove only the tenant's own schedules and
// triggers, and the dispatcher's role may store schedules and submit
// their firings.
func TestTenantSchedulesAndTriggersAreScoped(t *testing.T) {
	s := newSetup(t)
	f := fleettest.New(t, fleettest.Opts{Server: s.Srv, Connect: s.fleetConnect})
	acme := s.connect(s.creds("acme", time.Hour), nil, nats.CustomInboxPrefix(tenancy.InboxPrefix("acme")))
	cl, err := fleetapi.NewTenantClient(acme, f.Names, tenancy.JSAPIPrefix)
	require.NoError(t, err)
	ctx := ctxT(t, 2*time.Minute)

	// The operator's schedule of another tenant.
	r, err := f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Tenant: "other", Name: "theirs",
		Spec: &protocol.ScheduleSpec{Every: "1h"}, Job: &protocol.Job{Prompt: "p"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)

	queued := make(chan protocol.StatusEvent, 16)
	sub, err := f.NC.Subscribe("fleet.query.acme.*.status", func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Trigger != nil {
			queued <- ev
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()

	r, err = cl.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Name: "mine",
		Spec: &protocol.ScheduleSpec{Every: "1s"}, Job: &protocol.Job{Prompt: "p"}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Equal(t, "acme", r.Schedules[0].Tenant)

	// Its firing is submitted with the dispatcher's creds.
	select {
	case ev := <-queued:
		require.Equal(t, protocol.TriggerSchedule, ev.Trigger.Kind)
		require.Equal(t, "mine", ev.Trigger.Name)
	case <-ctx.Done():
		t.Fatal("no job of acme's schedule was queued")
	}

	r, err = cl.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleList})
	require.NoError(t, err)
	require.Len(t, r.Schedules, 1, "acme lists its own schedules only")
	require.Equal(t, "mine", r.Schedules[0].Name)

	r, err = cl.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleRemove, Tenant: "other", Name: "theirs"})
	require.NoError(t, err)
	require.NotNil(t, r.Error, "naming another tenant is refused")
	r, err = cl.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleRemove, Name: "theirs"})
	require.NoError(t, err)
	require.Equal(t, protocol.CodeNotFound, r.Error.Code, "another tenant's schedule is not acme's to remove")
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleList, Tenant: "other"})
	require.NoError(t, err)
	require.Len(t, r.Schedules, 1)
	r, err = cl.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleRemove, Name: "mine"})
	require.NoError(t, err)
	require.Nil(t, r.Error)

	// Triggers likewise.
	call := func(req trigger.Request) trigger.Reply {
		b, _ := json.Marshal(req)
		m, err := acme.RequestWithContext(ctx, trigger.Subject(f.Names), b)
		require.NoError(t, err)
		var rep trigger.Reply
		require.NoError(t, json.Unmarshal(m.Data, &rep))
		return rep
	}
	rep := call(trigger.Request{Action: "add", Name: "hook", Template: json.RawMessage(`{"prompt":"{{ .x }}"}`)})
	require.Nil(t, rep.Error)
	require.Equal(t, "/v1/triggers/acme/hook", rep.Triggers[0].Path)
	rep = call(trigger.Request{Action: "add", Tenant: "other", Name: "hook", Template: json.RawMessage(`{"prompt":"p"}`)})
	require.NotNil(t, rep.Error)
	rep = call(trigger.Request{Action: "ls"})
	require.Len(t, rep.Triggers, 1)
	require.Equal(t, "acme", rep.Triggers[0].Tenant)
}
