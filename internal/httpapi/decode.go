package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// MaxBodyBytes bounds a request body: the largest job the fleet takes.
const MaxBodyBytes = protocol.MaxJobBytes

// errBadRequest is wrapped by every decoding error (400).
var errBadRequest = errors.New("bad request")

func badRequest(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errBadRequest}, a...)...)
}

// readBody checks the content type (application/json) and reads at most
// MaxBodyBytes.
func readBody(r *http.Request) ([]byte, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return nil, badRequest("Content-Type must be application/json, got %q", r.Header.Get("Content-Type"))
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, badRequest("reading the body: %v", err)
	}
	if len(b) > MaxBodyBytes {
		return nil, badRequest("the body is larger than %d bytes", MaxBodyBytes)
	}
	return b, nil
}

// decodeJob reads a job body (docs/protocol.md) for tenant p: a JSON object
// whose tenant, when given, must be p's (an operator's is taken as is). It
// returns the body to submit, with the tenant set and every other field
// unchanged (unknown fields are kept: the job format ignores them, see
// docs/protocol.md), and the job as
// decoded. A job that fails validation is a bad request.
func decodeJob(b []byte, p Principal) ([]byte, protocol.Job, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return nil, protocol.Job{}, badRequest("the body must be a JSON object (a job)")
	}
	jp, err := protocol.DecodeJob(protocol.ContentTypeJSON, b)
	if err != nil {
		return nil, protocol.Job{}, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	job := *jp
	switch {
	case p.Operator && job.Tenant == "":
		job.Tenant = protocol.DefaultTenant
	case !p.Operator && job.Tenant == "":
		job.Tenant = p.Tenant
	case !p.Operator && job.Tenant != p.Tenant:
		return nil, job, errForbidden
	}
	// An id is assigned by the dispatcher when absent; validate with a
	// placeholder so every other field is checked here.
	check := job
	if check.ID == "" {
		check.ID = "x"
	}
	if err := check.Validate("", false); err != nil {
		return nil, job, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	t, _ := json.Marshal(job.Tenant)
	obj["tenant"] = t
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, job, badRequest("%v", err)
	}
	return out, job, nil
}

// errForbidden: a tenant principal named another tenant.
var errForbidden = errors.New("a tenant token acts on its own tenant only")

// strict decodes b into v, refusing unknown fields and trailing data.
func strict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("%v", err)
	}
	if dec.More() {
		return badRequest("trailing data after the JSON object")
	}
	return nil
}

// InputBody is POST /v1/queries/{id}/input.
type InputBody struct {
	Text string `json:"text"`
}

// ApprovalBody is POST /v1/queries/{id}/approvals/{request_id}.
type ApprovalBody struct {
	Allow   *bool  `json:"allow"`
	Message string `json:"message,omitempty"`
}

func decodeInput(b []byte) (InputBody, error) {
	var in InputBody
	if err := strict(b, &in); err != nil {
		return in, err
	}
	if strings.TrimSpace(in.Text) == "" {
		return in, badRequest("text: must not be empty")
	}
	if len(in.Text) > protocol.MaxPromptBytes {
		return in, badRequest("text: at most %d bytes", protocol.MaxPromptBytes)
	}
	return in, nil
}

func decodeApproval(b []byte) (ApprovalBody, error) {
	var a ApprovalBody
	if err := strict(b, &a); err != nil {
		return a, err
	}
	if a.Allow == nil {
		return a, badRequest("allow: required (true or false)")
	}
	if len(a.Message) > protocol.MaxMessageBytes {
		return a, badRequest("message: at most %d bytes", protocol.MaxMessageBytes)
	}
	return a, nil
}

// emptyBody accepts no body, or an empty JSON object (cancel, end).
func emptyBody(r *http.Request) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 4097))
	if err != nil {
		return badRequest("reading the body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	var none struct{}
	return strict(b, &none)
}

// encodeCursor makes the opaque cursor after status key key.
func encodeCursor(key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}

// decodeCursor reads a cursor: a status key under prefix.
func decodeCursor(c, prefix string) (string, error) {
	if c == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	key := string(b)
	if err != nil || !strings.HasPrefix(key, prefix) || !strings.HasPrefix(key, storage.StatusPrefix("")) {
		return "", badRequest("cursor: not a cursor of this listing")
	}
	return key, nil
}

// parseLastEventID reads Last-Event-ID: a Fleet-Seq ("" = from the start).
func parseLastEventID(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, badRequest("Last-Event-ID: must be a Fleet-Seq (a number), got %q", s)
	}
	return n, nil
}

// parseLimit reads ?limit= (1..MaxPage, default DefaultPage).
func parseLimit(s string) (int, error) {
	if s == "" {
		return DefaultPage, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxPage {
		return 0, badRequest("limit: must be between 1 and %d", MaxPage)
	}
	return n, nil
}
