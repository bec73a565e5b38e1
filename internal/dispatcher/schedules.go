package dispatcher

// Schedules: <prefix>.api.schedule (and a tenant's, scoped) adds, lists,
// removes, pauses and resumes schedules kept by internal/schedule, and the
// schedules part turns their firings into jobs through api.submit.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentfleet/agentfleet/internal/schedule"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Codes of schedule replies.
const (
	codeScheduleExists   = "exists"
	codeScheduleNotFound = protocol.CodeNotFound
)

// schedules is the part that owns the schedules stream and its firer.
type schedules struct {
	store *schedule.Store
	firer *schedule.Firer
}

func (s *schedules) start(ctx context.Context) error {
	if err := s.store.Ensure(ctx); err != nil {
		return err
	}
	return s.firer.Start(ctx)
}

func (s *schedules) stop(ctx context.Context) error { return s.firer.Stop(ctx) }

// submitFired submits a firing's job: validated like any submission.
func (h *api) submitFired(ctx context.Context, job *protocol.Job) (bool, error) {
	if err := job.Validate("", true); err != nil {
		return true, err
	}
	rep := h.submit(ctx, job)
	if rep.Error != nil {
		return rep.Error.Code == protocol.CodeInvalidJob, errors.New(rep.Error.Message)
	}
	return false, nil
}

// schedule answers a schedule request (decoded and checked).
func (h *api) schedule(ctx context.Context, req protocol.ScheduleRequest) protocol.ScheduleReply {
	st := h.scheduleStore
	var err error
	switch req.Action {
	case protocol.ScheduleAdd:
		def := schedule.Definition{Name: req.Name, Tenant: req.Tenant, Spec: *req.Spec, Job: *req.Job, Created: time.Now().UTC()}
		if err = st.Add(ctx, def); err == nil {
			h.log.Info().Str("tenant", req.Tenant).Str("schedule", req.Name).Msg("schedule added")
			return h.scheduleList(ctx, req.Tenant, req.Name)
		}
	case protocol.ScheduleList:
		return h.scheduleList(ctx, req.Tenant, req.Name)
	case protocol.ScheduleRemove:
		if err = st.Remove(ctx, req.Tenant, req.Name); err == nil {
			h.log.Info().Str("tenant", req.Tenant).Str("schedule", req.Name).Msg("schedule removed")
			return protocol.ScheduleReply{}
		}
	case protocol.SchedulePause, protocol.ScheduleResume:
		if err = st.SetPaused(ctx, req.Tenant, req.Name, req.Action == protocol.SchedulePause); err == nil {
			return h.scheduleList(ctx, req.Tenant, req.Name)
		}
	}
	return protocol.ScheduleReply{Error: scheduleError(err)}
}

func scheduleError(err error) *protocol.ErrorInfo {
	switch {
	case errors.Is(err, schedule.ErrNotFound):
		return apiError(codeScheduleNotFound, err.Error())
	case errors.Is(err, schedule.ErrExists):
		return apiError(codeScheduleExists, err.Error())
	}
	return apiError(protocol.CodeInternal, err.Error())
}

// scheduleList lists tenant's schedules ("" every tenant's), or the one
// named, with the state of each one's latest job.
func (h *api) scheduleList(ctx context.Context, tenant, name string) protocol.ScheduleReply {
	entries, err := h.scheduleStore.List(ctx, tenant)
	if err != nil {
		return protocol.ScheduleReply{Error: scheduleError(err)}
	}
	now := time.Now()
	out := []protocol.ScheduleInfo{}
	for _, e := range entries {
		if name != "" && e.Def.Name != name {
			continue
		}
		var state protocol.State
		info := e.Info(now, "")
		if info.LastJob != "" {
			if st, err := h.index.lookup(ctx, protocol.QueryRef{Tenant: e.Def.Tenant, ID: info.LastJob}); err == nil {
				state = st.State
			}
		}
		info.LastState = state
		out = append(out, info)
	}
	if name != "" && len(out) == 0 {
		return protocol.ScheduleReply{Error: apiError(codeScheduleNotFound, "no such schedule: "+name)}
	}
	return protocol.ScheduleReply{Schedules: out}
}

// decodeSchedule reads a schedule request: unknown fields refused, the
// name and, for "add", the spec and the job checked.
func decodeSchedule(data []byte) (protocol.ScheduleRequest, *protocol.ErrorInfo) {
	var req protocol.ScheduleRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, apiError(protocol.CodeInvalidJob, "schedule request: "+err.Error())
	}
	if req.Action != protocol.ScheduleList || req.Name != "" {
		req.Tenant = cmp.Or(req.Tenant, protocol.DefaultTenant)
	}
	if req.Tenant != "" && !protocol.ValidTenant(req.Tenant) {
		return req, apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)
	}
	switch req.Action {
	case protocol.ScheduleList:
		if req.Name == "" {
			return req, nil
		}
	case protocol.ScheduleAdd, protocol.ScheduleRemove, protocol.SchedulePause, protocol.ScheduleResume:
	default:
		return req, apiError(protocol.CodeInvalidJob, `action: must be "add", "ls", "rm", "pause" or "resume"`)
	}
	if !protocol.ValidScheduleName(req.Name) {
		return req, apiError(protocol.CodeInvalidJob, "name: must match "+protocol.ScheduleNamePattern)
	}
	if req.Action != protocol.ScheduleAdd {
		return req, nil
	}
	if req.Spec == nil || req.Job == nil {
		return req, apiError(protocol.CodeInvalidJob, "add needs a spec and a job")
	}
	if _, err := schedule.Compile(*req.Spec, time.Now()); err != nil {
		return req, apiError(protocol.CodeInvalidJob, err.Error())
	}
	job := *req.Job
	if job.ID != "" {
		return req, apiError(protocol.CodeInvalidJob, "job.id: a schedule's job gets its id per firing; leave it out")
	}
	if job.Tenant != "" && job.Tenant != req.Tenant {
		return req, apiError(protocol.CodeInvalidJob, "job.tenant: must be the schedule's tenant")
	}
	job.Tenant, job.Trigger = req.Tenant, nil
	probe := job
	probe.ID = protocol.ScheduleJobID(req.Name, time.Now())
	if err := probe.Validate("", true); err != nil {
		return req, apiError(protocol.CodeInvalidJob, "job: "+err.Error())
	}
	if err := protocol.RefuseToken(&probe); err != nil {
		return req, apiError(protocol.CodeInvalidJob, "job: "+err.Error())
	}
	req.Job = &job
	return req, nil
}
