package httpapi

import (
	"encoding/json"
	"net/http"
)

// Error codes of the API's error bodies.
const (
	CodeBadRequest   = "bad_request"
	CodeInvalidJob   = "invalid_job"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeDuplicate    = "duplicate"
	CodeFinished     = "already_finished"
	CodeRateLimited  = "rate_limited"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// ErrorBody is every error answer: {"error":{"code","message"}}.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo says what went wrong.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentfleet"`)
	}
	writeJSON(w, status, ErrorBody{Error: ErrorInfo{Code: code, Message: msg}})
}
