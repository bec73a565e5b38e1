package tenancy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ErrScope: a tenant's request names another tenant, or is not one a
// tenant may send.
var ErrScope = errors.New("tenancy: not allowed for this tenant")

// ParseTenantAPISubject splits <prefix>.tapi.<tenant>.<op> (the subject a
// tenant's API request arrives on in FLEET, set by the server's import,
// never by the tenant).
func ParseTenantAPISubject(prefix, subject string) (tenant, op string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".tapi.")
	if !ok {
		return "", "", fmt.Errorf("%w: %q is not a tenant API subject", ErrScope, subject)
	}
	tenant, op, ok = strings.Cut(rest, ".")
	if !ok || strings.Contains(op, ".") || op == "" {
		return "", "", fmt.Errorf("%w: %q is not a tenant API subject", ErrScope, subject)
	}
	if err := ValidTenant(tenant); err != nil {
		return "", "", err
	}
	return tenant, op, nil
}

// ScopeJob makes a submitted job tenant's: a job naming another tenant is
// refused; one naming none gets tenant; a key that is not byte-exactly
// one of protocol.Job's, or given twice, is refused. It returns the job
// as JSON (a msgpack job is converted).
func ScopeJob(tenant, contentType string, data []byte) ([]byte, error) {
	job, err := protocol.DecodeJob(contentType, data)
	if err != nil {
		return nil, err
	}
	if err := strictJob(contentType, data); err != nil {
		return nil, err
	}
	if job.Tenant != "" && job.Tenant != tenant {
		return nil, fmt.Errorf("%w: the job names tenant %q; these credentials are tenant %q's", ErrScope, job.Tenant, tenant)
	}
	job.Tenant = tenant
	return json.Marshal(job)
}

// ScopeRequest makes an API request body (a JSON object with an optional
// "tenant", as cancel, status, list and the session ops take) tenant's: a
// body naming another tenant is refused, and every key that decodes as
// "tenant" (encoding/json matches keys without regard to case) is replaced
// by tenant.
func ScopeRequest(tenant string, data []byte) ([]byte, error) {
	obj := map[string]json.RawMessage{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &obj); err != nil {
			return nil, fmt.Errorf("request must be a JSON object: %w", err)
		}
	}
	if obj == nil { // the body was null
		obj = map[string]json.RawMessage{}
	}
	for k, v := range obj {
		if !strings.EqualFold(k, "tenant") {
			continue
		}
		var named string
		if json.Unmarshal(v, &named) != nil || (named != "" && named != tenant) {
			return nil, fmt.Errorf("%w: the request names tenant %s; these credentials are tenant %q's", ErrScope, v, tenant)
		}
		delete(obj, k)
	}
	t, _ := json.Marshal(tenant)
	obj["tenant"] = t
	return json.Marshal(obj)
}
