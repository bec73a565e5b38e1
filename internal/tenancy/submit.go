package tenancy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/agentfleet/agentfleet/internal/strictjson"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// TenantSubmitSubject is the fleet-side subject of tenant's jobs: its
// account imports <prefix>.tsub.<tenant> as <prefix>.jobs.<tenant>, and
// the dispatcher serves <prefix>.tsub.* (ScopeSubmission), publishing
// the job it builds on <prefix>.jobs.<tenant> and answering the PubAck.
func TenantSubmitSubject(prefix, tenant string) string { return prefix + ".tsub." + tenant }

// maxMsgIDBytes bounds a tenant's Nats-Msg-Id.
const maxMsgIDBytes = 200

var (
	traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
	tracestateRE  = regexp.MustCompile(`^[\x21-\x7e]([\x20-\x7e]{0,510}[\x21-\x7e])?$`)
)

// Submission is a tenant's job as the dispatcher publishes it: a body,
// message id and headers it built itself.
type Submission struct {
	Job    *protocol.Job
	Body   []byte
	Header nats.Header
}

// ScopeSubmission checks a job tenant published on its jobs subject
// (data with its headers hdr) and builds the message to publish:
//   - the job decoded into protocol.Job with every key byte-exactly one of
//     its fields (unknown, case-folded or repeated keys refused), valid,
//     naming tenant or no tenant, re-encoded as JSON;
//   - Nats-Msg-Id <tenant>.<the tenant's Nats-Msg-Id or the job's id>,
//     so no tenant's id can make another's job a duplicate (an id that
//     already starts with <tenant>. is kept as it is: fleet.api.submit's
//     ids are <tenant>.<id> too);
//   - W3C traceparent and tracestate when well formed; no other header.
func ScopeSubmission(tenant string, hdr nats.Header, data []byte) (*Submission, error) {
	ct := hdr.Get(protocol.HeaderContentType)
	job, err := protocol.DecodeJob(ct, data)
	if err != nil {
		return nil, err
	}
	if err := strictJob(ct, data); err != nil {
		return nil, err
	}
	if job.Tenant != "" && job.Tenant != tenant {
		return nil, fmt.Errorf("%w: the job names tenant %q; these credentials are tenant %q's", ErrScope, job.Tenant, tenant)
	}
	job.Tenant = tenant
	if err := job.Validate(tenant, true); err != nil {
		return nil, err
	}
	if err := protocol.RefuseFleetOnly(job); err != nil {
		return nil, err
	}
	id := hdr.Get(protocol.HeaderMsgID)
	switch {
	case id == "":
		id = protocol.JobMsgID(tenant, job.ID)
	case len(id) > maxMsgIDBytes || strings.IndexFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return nil, fmt.Errorf("%s must be 1 to %d printable ASCII characters without spaces", protocol.HeaderMsgID, maxMsgIDBytes)
	case !strings.HasPrefix(id, tenant+"."):
		id = tenant + "." + id
	}
	body, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	out := nats.Header{}
	out.Set(protocol.HeaderContentType, protocol.ContentTypeJSON)
	out.Set(protocol.HeaderMsgID, id)
	if tp := hdr.Get("traceparent"); traceparentRE.MatchString(tp) && tp[3:35] != strings.Repeat("0", 32) && tp[36:52] != strings.Repeat("0", 16) {
		out.Set("traceparent", tp)
		if ts := hdr.Get("tracestate"); tracestateRE.MatchString(ts) {
			out.Set("tracestate", ts)
		}
	}
	return &Submission{Job: job, Body: body, Header: out}, nil
}

// strictJob refuses a job body with a key that is not byte-exactly one
// of protocol.Job's (at any depth), or a key given twice. A msgpack body
// is checked as the JSON of its map.
func strictJob(contentType string, data []byte) error {
	if c, _ := protocol.CodecFor(contentType); c != nil {
		if _, isMsgpack := c.(protocol.Msgpack); isMsgpack {
			var loose any
			if err := msgpack.NewDecoder(bytes.NewReader(data)).Decode(&loose); err != nil {
				return fmt.Errorf("job: %w", err)
			}
			b, err := json.Marshal(loose)
			if err != nil {
				return fmt.Errorf("job: %w", err)
			}
			data = b
		}
	}
	var job protocol.Job
	if err := strictjson.Decode(data, &job); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	return nil
}
