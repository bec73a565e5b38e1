package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func TestCompileAndNext(t *testing.T) {
	now := time.Date(2026, 12, 7, 15, 4, 5, 0, time.UTC)

	c, err := Compile(protocol.ScheduleSpec{Every: "90s"}, now)
	require.NoError(t, err)
	require.Equal(t, "@every 1m30s", c.Pattern)
	n, ok := c.Next(now, now)
	require.True(t, ok)
	require.Equal(t, now.Add(90*time.Second), n)
	n, _ = c.Next(now, now.Add(100*time.Second)) // the second interval
	require.Equal(t, now.Add(180*time.Second), n)

	// Paris is UTC+1 in December: 09:00 there is 08:00 UTC, on weekdays.
	c, err = Compile(protocol.ScheduleSpec{Cron: "0  0 9 * * 1-5", TZ: "Europe/Paris"}, now)
	require.NoError(t, err)
	require.Equal(t, "0 0 9 * * 1-5", c.Pattern)
	require.Equal(t, "Europe/Paris", c.TZ)
	require.Equal(t, "0 0 9 * * 1-5 Europe/Paris", c.String())
	n, _ = c.Next(now, now)
	require.Equal(t, time.Date(2026, 12, 8, 8, 0, 0, 0, time.UTC), n)

	at := now.Add(time.Hour)
	c, err = Compile(protocol.ScheduleSpec{At: at.Format(time.RFC3339)}, now)
	require.NoError(t, err)
	n, ok = c.Next(now, now)
	require.True(t, ok)
	require.Equal(t, at, n)
	_, ok = c.Next(now, at.Add(time.Second))
	require.False(t, ok, "a one-time schedule past its time fires no more")

	c, err = Compile(protocol.ScheduleSpec{Cron: "@hourly"}, now)
	require.NoError(t, err)
	n, _ = c.Next(now, now)
	require.Equal(t, time.Date(2026, 12, 7, 16, 0, 0, 0, time.UTC), n)
}

func TestFiredJobIsNamedAfterItsFireTime(t *testing.T) {
	def := Definition{Name: "nightly", Tenant: "acme", Job: protocol.Job{Prompt: "p"}}
	at := time.Date(2026, 12, 7, 2, 0, 0, 400_000_000, time.UTC)
	job := FiredJob(def, at)
	require.Equal(t, "nightly-20261207T020000Z", job.ID)
	require.Equal(t, "acme", job.Tenant)
	require.Equal(t, &protocol.Trigger{Kind: protocol.TriggerSchedule, Name: "nightly", FireAt: job.Trigger.FireAt}, job.Trigger)
	require.Equal(t, at.Truncate(time.Second), *job.Trigger.FireAt)
	require.NoError(t, job.Validate("", true))
	require.Empty(t, def.Job.ID, "the definition's job is not changed")
}
