package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// cronParser reads the six-field cron of nats-server's schedules: second
// minute hour day-of-month month day-of-week, and the @hourly forms.
var cronParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Compiled is a checked ScheduleSpec.
type Compiled struct {
	// Pattern is the Nats-Schedule header's value; TZ the
	// Nats-Schedule-Time-Zone header's ("" for none).
	Pattern, TZ string

	every time.Duration
	cron  cron.Schedule
	at    time.Time
}

// Compile checks spec and returns it compiled, or an error naming the
// field at fault. now is the time of the request: a one-time schedule
// must be after it.
func Compile(spec protocol.ScheduleSpec, now time.Time) (Compiled, error) {
	set := 0
	for _, v := range []string{spec.Every, spec.Cron, spec.At} {
		if v != "" {
			set++
		}
	}
	if set != 1 {
		return Compiled{}, fmt.Errorf("spec: exactly one of every, cron or at is required")
	}
	if spec.TZ != "" && spec.Cron == "" {
		return Compiled{}, fmt.Errorf("tz: a time zone goes with cron only")
	}
	switch {
	case spec.Every != "":
		d, err := time.ParseDuration(spec.Every)
		if err != nil {
			return Compiled{}, fmt.Errorf("every: %q is not a duration (e.g. 90s, 15m, 24h)", spec.Every)
		}
		if d < time.Second {
			return Compiled{}, fmt.Errorf("every: must be at least 1s, got %s", spec.Every)
		}
		return Compiled{Pattern: "@every " + d.String(), every: d}, nil
	case spec.At != "":
		t, err := time.Parse(time.RFC3339, spec.At)
		if err != nil {
			return Compiled{}, fmt.Errorf("at: %q is not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z)", spec.At)
		}
		if !t.After(now) {
			return Compiled{}, fmt.Errorf("at: %s is not in the future", spec.At)
		}
		t = t.UTC()
		return Compiled{Pattern: "@at " + t.Format(time.RFC3339), at: t}, nil
	}
	expr := strings.Join(strings.Fields(spec.Cron), " ")
	if !strings.HasPrefix(expr, "@") && len(strings.Fields(expr)) != 6 {
		return Compiled{}, fmt.Errorf("cron: %q must have six fields: second minute hour day-of-month month day-of-week", spec.Cron)
	}
	if strings.HasPrefix(expr, "@every") {
		return Compiled{}, fmt.Errorf("cron: use every for %q", spec.Cron)
	}
	sched, err := cronParser.Parse(expr)
	if err != nil {
		return Compiled{}, fmt.Errorf("cron: %q: %w", spec.Cron, err)
	}
	if spec.TZ != "" {
		if _, err := time.LoadLocation(spec.TZ); err != nil || strings.EqualFold(spec.TZ, "local") {
			return Compiled{}, fmt.Errorf("tz: %q is not an IANA time zone (e.g. Europe/Paris)", spec.TZ)
		}
	}
	return Compiled{Pattern: expr, TZ: spec.TZ, cron: sched}, nil
}

// String is the spec as `ls` shows it.
func (c Compiled) String() string {
	if c.TZ != "" {
		return c.Pattern + " " + c.TZ
	}
	return c.Pattern
}

// Next is the first firing after t (base is when the schedule was stored,
// from which an interval counts), and false for a one-time schedule
// already past.
func (c Compiled) Next(base, t time.Time) (time.Time, bool) {
	switch {
	case c.every > 0:
		first := base.UTC().Round(time.Second).Add(c.every)
		if first.After(t) {
			return first, true
		}
		k := int64(t.Sub(first)/c.every) + 1
		return first.Add(c.every * time.Duration(k)), true
	case !c.at.IsZero():
		return c.at, c.at.After(t)
	}
	loc := time.UTC
	if c.TZ != "" {
		loc, _ = time.LoadLocation(c.TZ)
	}
	return c.cron.Next(t.In(loc)).UTC(), true
}
