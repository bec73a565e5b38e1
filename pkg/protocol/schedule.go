package protocol

import (
	"fmt"
	"regexp"
	"time"
)

// Trigger says what started a job, when not a producer's submit: a
// schedule's firing, a GitHub event, an inbound webhook. The fleet sets it
// on the jobs it starts itself; statuses carry it.
type Trigger struct {
	// Kind is TriggerSchedule, TriggerGitHub or TriggerWebhook.
	Kind string `json:"kind" msgpack:"kind"`
	// Name is the schedule's or inbound webhook's name.
	Name string `json:"name,omitempty" msgpack:"name,omitempty"`
	// Event, Delivery and URL describe a GitHub event: its type, its
	// delivery id and the page of the issue or pull request.
	Event    string `json:"event,omitempty" msgpack:"event,omitempty"`
	Delivery string `json:"delivery,omitempty" msgpack:"delivery,omitempty"`
	URL      string `json:"url,omitempty" msgpack:"url,omitempty"`
	// FireAt is the time a schedule fired for this job.
	FireAt *time.Time `json:"fire_at,omitempty" msgpack:"fire_at,omitempty"`
}

// Trigger kinds.
const (
	TriggerSchedule = "schedule"
	TriggerGitHub   = "github"
	TriggerWebhook  = "webhook"
)

func (t *Trigger) validate() error {
	if t == nil {
		return nil
	}
	switch t.Kind {
	case TriggerSchedule, TriggerGitHub, TriggerWebhook:
	default:
		return invalid("trigger.kind", fmt.Sprintf("must be %q, %q or %q, got %s", TriggerSchedule, TriggerGitHub, TriggerWebhook, quoteShort(t.Kind)))
	}
	for field, v := range map[string]string{"trigger.name": t.Name, "trigger.event": t.Event, "trigger.delivery": t.Delivery, "trigger.url": t.URL} {
		if len(v) > 512 {
			return invalid(field, "is longer than 512 bytes")
		}
	}
	return nil
}

// ScheduleNamePattern is what a schedule's name matches: one subject
// token, short enough that "<name>-<yyyymmddThhmmssZ>" is a job id.
const ScheduleNamePattern = `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`

var scheduleNameRE = regexp.MustCompile(ScheduleNamePattern)

// ValidScheduleName reports whether s matches ScheduleNamePattern.
func ValidScheduleName(s string) bool { return scheduleNameRE.MatchString(s) }

// ScheduleFireLayout is the layout of a fire time in the id of the job a
// schedule fired: "<name>-20261207T154500Z".
const ScheduleFireLayout = "20060102T150405Z"

// ScheduleJobID is the id of the job schedule name fires at t (UTC, to
// the second), the same for every delivery of that firing.
func ScheduleJobID(name string, t time.Time) string {
	return name + "-" + t.UTC().Truncate(time.Second).Format(ScheduleFireLayout)
}

// ScheduleSpec is when a schedule fires: exactly one of Every (a Go
// duration, at least 1s), Cron (six fields: second minute hour
// day-of-month month day-of-week, with TZ an IANA zone) or At (RFC 3339).
type ScheduleSpec struct {
	Every string `json:"every,omitempty" msgpack:"every,omitempty"`
	Cron  string `json:"cron,omitempty" msgpack:"cron,omitempty"`
	TZ    string `json:"tz,omitempty" msgpack:"tz,omitempty"`
	At    string `json:"at,omitempty" msgpack:"at,omitempty"`
}

// Schedule actions of a ScheduleRequest.
const (
	ScheduleAdd    = "add"
	ScheduleList   = "ls"
	ScheduleRemove = "rm"
	SchedulePause  = "pause"
	ScheduleResume = "resume"
)

// ScheduleRequest is a request on <prefix>.api.schedule.
type ScheduleRequest struct {
	Action string `json:"action"`
	Tenant string `json:"tenant,omitempty"`
	Name   string `json:"name,omitempty"`
	// Spec and Job are for "add": when, and the job each firing submits
	// (its id is set per firing; its tenant is the schedule's).
	Spec *ScheduleSpec `json:"spec,omitempty"`
	Job  *Job          `json:"job,omitempty"`
}

// ScheduleInfo is one schedule as "ls" and "add" answer it.
type ScheduleInfo struct {
	Name   string       `json:"name"`
	Tenant string       `json:"tenant"`
	Spec   string       `json:"spec"`
	When   ScheduleSpec `json:"when"`
	Paused bool         `json:"paused,omitempty"`
	// Next is the next firing, when known (none while paused, nor after a
	// one-time schedule has fired).
	Next *time.Time `json:"next,omitempty"`
	// LastJob is the id of the job of the latest firing, LastState its
	// state when known.
	LastJob   string    `json:"last_job,omitempty"`
	LastState State     `json:"last_state,omitempty"`
	Prompt    string    `json:"prompt,omitempty"`
	Created   time.Time `json:"created"`
}

// ScheduleReply answers a ScheduleRequest.
type ScheduleReply struct {
	Schedules []ScheduleInfo `json:"schedules,omitempty"`
	Error     *ErrorInfo     `json:"error,omitempty"`
}

// APISchedule is the subject of schedule requests.
func (n Names) APISchedule() string { return n.p() + ".api.schedule" }

// SchedulesStream is the stream of schedules and their firings.
func (n Names) SchedulesStream() string { return n.upper() + "_SCHEDULES" }

// ScheduleSubject holds schedule name of tenant (its definition, and
// while active its server-side schedule).
func (n Names) ScheduleSubject(tenant, name string) string {
	return n.p() + ".sched." + tenant + "." + name
}

// ScheduleFireSubject is where the server publishes a firing of
// schedule name of tenant.
func (n Names) ScheduleFireSubject(tenant, name string) string {
	return n.p() + ".fire." + tenant + "." + name
}
