package dispatcher

// Decoding API requests: each decoder reads a request from any client and
// returns it validated, or the error to reply with (invalid_job).

import (
	"cmp"
	"encoding/json"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

func apiError(code, msg string) *protocol.ErrorInfo {
	return &protocol.ErrorInfo{Code: code, Message: msg}
}

// decodeJob reads a submission (JSON or msgpack, by content type), gives
// it a fresh id when it has none, and validates it.
func decodeJob(contentType string, data []byte) (*protocol.Job, *protocol.ErrorInfo) {
	job, err := protocol.DecodeJob(contentType, data)
	if err == nil {
		if job.ID == "" {
			job.ID = NewID()
		}
		err = job.Validate("", false)
	}
	if err == nil {
		err = protocol.RefuseFleetOnly(job)
	}
	if err != nil {
		return nil, apiError(protocol.CodeInvalidJob, err.Error())
	}
	return job, nil
}

func decodeRef(data []byte) (protocol.QueryRef, *protocol.ErrorInfo) {
	var ref protocol.QueryRef
	if err := json.Unmarshal(data, &ref); err != nil {
		return ref, apiError(protocol.CodeInvalidJob, "request must be JSON {\"id\",\"tenant\"}: "+err.Error())
	}
	ref.Tenant = cmp.Or(ref.Tenant, protocol.DefaultTenant)
	if !protocol.ValidID(ref.ID) {
		return ref, apiError(protocol.CodeInvalidJob, "id: must match "+protocol.IDPattern)
	}
	if !protocol.ValidTenant(ref.Tenant) {
		return ref, apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)
	}
	return ref, nil
}

// decodeList reads a list request ({tenant,state,limit,dead_letters};
// empty is every tenant's); a limit out of 1..1000 becomes 50.
func decodeList(data []byte) (protocol.ListRequest, *protocol.ErrorInfo) {
	var req protocol.ListRequest
	if len(data) > 0 {
		if err := json.Unmarshal(data, &req); err != nil {
			return req, apiError(protocol.CodeInvalidJob, "request must be JSON {tenant,state,limit}")
		}
	}
	if req.Tenant != "" && !protocol.ValidTenant(req.Tenant) {
		return req, apiError(protocol.CodeInvalidJob, "tenant: must match "+protocol.TenantPattern)
	}
	if req.Limit <= 0 || req.Limit > 1000 {
		req.Limit = 50
	}
	return req, nil
}

// opRequest is a decoded session op: the query and its .ctl op.
type opRequest struct {
	ref protocol.QueryRef
	ctl protocol.CtlOp
}

// decodeSessionOp reads a <prefix>.api.<op> request: the query and the op's
// fields, validated as a .ctl op.
func decodeSessionOp(op string, data []byte) (protocol.QueryRef, protocol.CtlOp, *protocol.ErrorInfo) {
	ref, e := decodeRef(data)
	if e != nil {
		return ref, protocol.CtlOp{}, e
	}
	var req protocol.SessionOpRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return ref, protocol.CtlOp{}, apiError(protocol.CodeInvalidJob, err.Error())
	}
	ctl := protocol.CtlOp{Op: op, SessionOp: req.SessionOp}
	if err := ctl.Validate(); err != nil {
		return ref, protocol.CtlOp{}, apiError(protocol.CodeInvalidJob, err.Error())
	}
	return ref, ctl, nil
}
