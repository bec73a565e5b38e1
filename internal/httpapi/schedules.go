package httpapi

// /v1/schedules: a tenant's schedules (docs/schedules.md) over HTTP, the
// same requests as `dispatcher schedule`.

import (
	"context"
	"errors"
	"net/http"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ScheduleBody is POST /v1/schedules.
type ScheduleBody struct {
	Name   string                `json:"name"`
	Tenant string                `json:"tenant,omitempty"`
	Spec   protocol.ScheduleSpec `json:"spec"`
	Job    protocol.Job          `json:"job"`
}

// SchedulesAnswer is the body of every /v1/schedules answer but DELETE.
type SchedulesAnswer struct {
	Schedules []protocol.ScheduleInfo `json:"schedules"`
}

func (a *API) routeSchedules() {
	a.route("GET /v1/schedules", a.scheduleList)
	a.route("POST /v1/schedules", a.scheduleAdd)
	a.route("GET /v1/schedules/{name}", a.scheduleOne(protocol.ScheduleList))
	a.route("DELETE /v1/schedules/{name}", a.scheduleOne(protocol.ScheduleRemove))
	a.route("POST /v1/schedules/{name}/pause", a.scheduleOne(protocol.SchedulePause))
	a.route("POST /v1/schedules/{name}/resume", a.scheduleOne(protocol.ScheduleResume))
}

func (a *API) scheduleList(w http.ResponseWriter, r *http.Request, p Principal) {
	asked := r.URL.Query().Get("tenant")
	tenant, ok := p.tenantFor(asked)
	if !ok {
		writeJSON(w, http.StatusOK, SchedulesAnswer{Schedules: []protocol.ScheduleInfo{}})
		return
	}
	if p.Operator && asked == "" {
		tenant = "" // every tenant's
	}
	a.schedule(w, r, http.StatusOK, protocol.ScheduleRequest{Action: protocol.ScheduleList, Tenant: tenant})
}

func (a *API) scheduleAdd(w http.ResponseWriter, r *http.Request, p Principal) {
	b, err := readBody(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	var body ScheduleBody
	if err := strict(b, &body); err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	tenant, ok := p.tenantFor(body.Tenant)
	if !ok || (!p.Operator && body.Job.Tenant != "" && body.Job.Tenant != p.Tenant) {
		writeError(w, http.StatusForbidden, CodeForbidden, errForbidden.Error())
		return
	}
	a.schedule(w, r, http.StatusCreated, protocol.ScheduleRequest{Action: protocol.ScheduleAdd, Tenant: tenant, Name: body.Name,
		Spec: &body.Spec, Job: &body.Job})
}

func (a *API) scheduleOne(action string) handler {
	return func(w http.ResponseWriter, r *http.Request, p Principal) {
		tenant, ok := p.tenantFor(r.URL.Query().Get("tenant"))
		name := r.PathValue("name")
		if !ok || !protocol.ValidScheduleName(name) {
			writeError(w, http.StatusNotFound, CodeNotFound, "no schedule "+name)
			return
		}
		a.schedule(w, r, http.StatusOK, protocol.ScheduleRequest{Action: action, Tenant: tenant, Name: name})
	}
}

// schedule sends req and answers with its reply.
func (a *API) schedule(w http.ResponseWriter, r *http.Request, ok int, req protocol.ScheduleRequest) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	rep, err := a.cfg.Client.Schedule(ctx, req)
	switch {
	case errors.Is(err, fleetapi.ErrUnavailable):
		a.unavailable(w, err)
	case err != nil:
		writeError(w, http.StatusBadGateway, CodeInternal, err.Error())
	case rep.Error != nil && rep.Error.Code == protocol.CodeNotFound:
		writeError(w, http.StatusNotFound, CodeNotFound, rep.Error.Message)
	case rep.Error != nil && rep.Error.Code == protocol.CodeInvalidJob:
		writeError(w, http.StatusBadRequest, CodeInvalidJob, rep.Error.Message)
	case rep.Error != nil && rep.Error.Code == "exists":
		writeError(w, http.StatusConflict, "exists", rep.Error.Message)
	case rep.Error != nil:
		writeError(w, http.StatusBadGateway, rep.Error.Code, rep.Error.Message)
	case req.Action == protocol.ScheduleRemove:
		w.WriteHeader(http.StatusNoContent)
	default:
		if rep.Schedules == nil {
			rep.Schedules = []protocol.ScheduleInfo{}
		}
		writeJSON(w, ok, SchedulesAnswer{Schedules: rep.Schedules})
	}
}
