package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// firedJobs collects the terminal statuses of jobs a schedule started.
type firedJobs struct {
	mu   sync.Mutex
	done map[string]protocol.StatusEvent
	ch   chan struct{}
}

func watchFired(t *testing.T, nc *nats.Conn, tenant string) *firedJobs {
	fj := &firedJobs{done: map[string]protocol.StatusEvent{}, ch: make(chan struct{}, 64)}
	sub, err := nc.Subscribe("fleet.query."+tenant+".*.status", func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Trigger == nil || !ev.State.Terminal() {
			return
		}
		fj.mu.Lock()
		fj.done[ev.ID] = ev
		fj.mu.Unlock()
		select {
		case fj.ch <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return fj
}

// waitFor waits until cond holds over the jobs seen.
func (fj *firedJobs) waitFor(t *testing.T, what string, cond func(map[string]protocol.StatusEvent) bool) {
	t.Helper()
	deadline := time.After(wait)
	for {
		fj.mu.Lock()
		ok := cond(fj.done)
		fj.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-fj.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var firedID = regexp.MustCompile(`^tick-\d{8}T\d{6}Z$`)

// TestScheduleFiresJobsAcrossADispatcherRestart: a schedule kept by the
// server fires jobs named after their fire time, carrying their trigger;
// a firing while no dispatcher runs is submitted when one starts; ls
// shows the next firing and the last job; pause, resume and rm act.
func TestScheduleFiresJobsAcrossADispatcherRestart(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	fired := watchFired(t, f.NC, "acme")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	r, err := f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Tenant: "acme", Name: "tick",
		Spec: &protocol.ScheduleSpec{Every: "1s"}, Job: &protocol.Job{Prompt: "scheduled hello", Metadata: map[string]string{"from": "schedule"}}})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Len(t, r.Schedules, 1)
	require.Equal(t, "@every 1s", r.Schedules[0].Spec)
	require.NotNil(t, r.Schedules[0].Next)

	// A second add of the name is refused; nothing is replaced.
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Tenant: "acme", Name: "tick",
		Spec: &protocol.ScheduleSpec{Every: "1h"}, Job: &protocol.Job{Prompt: "other"}})
	require.NoError(t, err)
	require.NotNil(t, r.Error)
	require.Equal(t, "exists", r.Error.Code)

	fired.waitFor(t, "two scheduled jobs to succeed", func(m map[string]protocol.StatusEvent) bool { return len(m) >= 2 })
	fired.mu.Lock()
	for id, ev := range fired.done {
		require.Regexp(t, firedID, id)
		require.Equal(t, protocol.StateSucceeded, ev.State, "%s", id)
		require.Equal(t, protocol.TriggerSchedule, ev.Trigger.Kind)
		require.Equal(t, "tick", ev.Trigger.Name)
		require.Equal(t, "schedule", ev.Metadata["from"])
	}
	fired.mu.Unlock()

	// The dispatcher goes away; the server goes on firing and stores the
	// firing; a new dispatcher submits it.
	f.StopDispatcher()
	stopped := time.Now()
	st, err := f.JS.Stream(ctx, f.Names.SchedulesStream())
	require.NoError(t, err)
	var missed *jetstream.RawStreamMsg
	fleettest.Eventually(t, wait, func() bool {
		m, err := st.GetLastMsgForSubject(ctx, f.Names.ScheduleFireSubject("acme", "tick"))
		if err == nil && m.Time.After(stopped) {
			missed = m
			return true
		}
		return false
	}, "a firing while no dispatcher runs")
	missedID := protocol.ScheduleJobID("tick", missed.Time)
	f.StartDispatcher()
	fired.waitFor(t, "the firing made while stopped ("+missedID+") to succeed", func(m map[string]protocol.StatusEvent) bool {
		ev, ok := m[missedID]
		return ok && ev.State == protocol.StateSucceeded
	})

	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleList, Tenant: "acme"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.Len(t, r.Schedules, 1)
	s := r.Schedules[0]
	require.Equal(t, "tick", s.Name)
	require.Regexp(t, firedID, s.LastJob)
	require.NotNil(t, s.Next)
	require.False(t, s.Paused)

	// Pause: no firing is stored after the pause is.
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.SchedulePause, Tenant: "acme", Name: "tick"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	require.True(t, r.Schedules[0].Paused)
	require.Nil(t, r.Schedules[0].Next)
	def, err := st.GetLastMsgForSubject(ctx, f.Names.ScheduleSubject("acme", "tick"))
	require.NoError(t, err)
	require.Empty(t, def.Header.Get("Nats-Schedule"), "a paused schedule carries no schedule header")
	// Resume re-arms it: a firing after the resume is stored.
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleResume, Tenant: "acme", Name: "tick"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	resumed := time.Now()
	fleettest.Eventually(t, wait, func() bool {
		m, err := st.GetLastMsgForSubject(ctx, f.Names.ScheduleFireSubject("acme", "tick"))
		return err == nil && m.Time.After(resumed)
	}, "a firing after resume")

	// rm removes the schedule and its firing.
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleRemove, Tenant: "acme", Name: "tick"})
	require.NoError(t, err)
	require.Nil(t, r.Error)
	_, err = st.GetLastMsgForSubject(ctx, f.Names.ScheduleSubject("acme", "tick"))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleList, Tenant: "acme"})
	require.NoError(t, err)
	require.Empty(t, r.Schedules)
}

// TestScheduleRefusesBadSpecs: an invalid cron, time zone, interval,
// one-time schedule in the past, or a job with its own id is refused at
// add with the field named, and nothing is stored.
func TestScheduleRefusesBadSpecs(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	job := &protocol.Job{Prompt: "p"}
	for _, c := range []struct {
		name  string
		spec  protocol.ScheduleSpec
		job   *protocol.Job
		field string
	}{
		{"cron-fields", protocol.ScheduleSpec{Cron: "0 9 * * *"}, job, "cron"},
		{"cron-range", protocol.ScheduleSpec{Cron: "0 0 25 * * *"}, job, "cron"},
		{"tz", protocol.ScheduleSpec{Cron: "0 0 9 * * *", TZ: "Mars/Olympus"}, job, "tz"},
		{"tz-without-cron", protocol.ScheduleSpec{Every: "1m", TZ: "UTC"}, job, "tz"},
		{"every", protocol.ScheduleSpec{Every: "10ms"}, job, "every"},
		{"at-past", protocol.ScheduleSpec{At: "2020-01-01T00:00:00Z"}, job, "at"},
		{"none", protocol.ScheduleSpec{}, job, "spec"},
		{"job-id", protocol.ScheduleSpec{Every: "1m"}, &protocol.Job{ID: "x", Prompt: "p"}, "job.id"},
		{"job-invalid", protocol.ScheduleSpec{Every: "1m"}, &protocol.Job{Prompt: ""}, "prompt"},
	} {
		r, err := f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Tenant: "acme", Name: "bad-" + c.name, Spec: &c.spec, Job: c.job})
		require.NoError(t, err, c.name)
		require.NotNil(t, r.Error, c.name)
		require.Equal(t, protocol.CodeInvalidJob, r.Error.Code, c.name)
		require.Contains(t, r.Error.Message, c.field, c.name)
	}
	r, err := f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleList, Tenant: "acme"})
	require.NoError(t, err)
	require.Empty(t, r.Schedules)
	r, err = f.Client.Schedule(ctx, protocol.ScheduleRequest{Action: protocol.ScheduleRemove, Tenant: "acme", Name: "nope"})
	require.NoError(t, err)
	require.Equal(t, protocol.CodeNotFound, r.Error.Code)

	// A producer cannot pass its job off as a schedule's.
	sr, err := f.Client.Submit(ctx, protocol.Job{Tenant: "acme", Prompt: "p", Trigger: &protocol.Trigger{Kind: protocol.TriggerSchedule, Name: "x"}})
	require.NoError(t, err)
	require.NotNil(t, sr.Error)
	require.Contains(t, sr.Error.Message, "trigger")
}

// TestScheduleCLI: the CLI's add, ls (table and --json), pause and rm,
// and its refusals, against a running fleet.
func TestScheduleCLI(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()

	code, _, errOut := runCLI(t, url, "", "schedule", "add", "acme", "nightly", "--cron", "0 0 2 * * *", "--tz", "Europe/Paris", "--max-turns", "3", "Update", "the", "deps")
	require.Equal(t, 0, code, errOut)
	code, out, errOut := runCLI(t, url, "", "schedule", "ls", "acme", "--json")
	require.Equal(t, 0, code, errOut)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 1)
	require.Equal(t, "nightly", list[0]["name"])
	require.Equal(t, "acme", list[0]["tenant"])
	require.Equal(t, "0 0 2 * * * Europe/Paris", list[0]["spec"])
	next, err := time.Parse(time.RFC3339, list[0]["next"].(string))
	require.NoError(t, err)
	require.Equal(t, 2, next.In(mustZone(t, "Europe/Paris")).Hour())

	code, out, errOut = runCLI(t, url, "", "schedule", "ls")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "nightly")
	require.Contains(t, out, "NEXT")

	code, _, errOut = runCLI(t, url, "", "schedule", "pause", "acme", "nightly")
	require.Equal(t, 0, code, errOut)
	code, out, _ = runCLI(t, url, "", "schedule", "ls", "acme")
	require.Equal(t, 0, code)
	require.Contains(t, out, "paused")

	code, _, errOut = runCLI(t, url, "", "schedule", "add", "acme", "bad", "--cron", "0 0 2 * *", "p")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "cron")
	code, _, errOut = runCLI(t, url, "", "schedule", "add", "acme", "bad", "--cron", "0 0 2 * * *", "--tz", "Nowhere/Else", "p")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "tz")
	code, _, errOut = runCLI(t, url, "", "schedule", "add", "acme", "bad", "--every", "1m", "--id", "x", "p")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--id")

	code, _, errOut = runCLI(t, url, "", "schedule", "rm", "acme", "nightly")
	require.Equal(t, 0, code, errOut)
	code, _, _ = runCLI(t, url, "", "schedule", "rm", "acme", "nightly")
	require.Equal(t, 3, code, "removing a schedule that is gone is not found")
}

func mustZone(t *testing.T, name string) *time.Location {
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}
