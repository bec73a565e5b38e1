package protocol

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "fleet"

// ConsumerName is the durable pull consumer every worker pulls jobs from.
const ConsumerName = "workers"

// Names builds every NATS subject, stream and bucket name the fleet uses from
// one configurable prefix. Nothing else in the code base spells a subject.
type Names struct {
	prefix string
	// stream is the prefix as stream names spell it, made once by
	// NewNames: stream names are built per job.
	stream string
}

// NewNames returns the names for prefix (DefaultPrefix when empty).
func NewNames(prefix string) Names {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Names{prefix: prefix, stream: streamPrefix(prefix)}
}

// Prefix is the configured subject prefix.
func (n Names) Prefix() string { return n.p() }

func (n Names) p() string {
	if n.prefix == "" {
		return DefaultPrefix
	}
	return n.prefix
}

// upper is the prefix as stream names spell it (the zero Names too).
func (n Names) upper() string {
	if n.stream != "" {
		return n.stream
	}
	return streamPrefix(n.p())
}

// streamPrefix spells prefix for stream names: upper case, with "-" and
// "." as "_".
func streamPrefix(prefix string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(prefix))
}

// JobsStream is the work-queue stream (FLEET_JOBS for the default prefix).
func (n Names) JobsStream() string { return n.upper() + "_JOBS" }

// QueriesStream captures every per-query subject (FLEET_QUERIES).
func (n Names) QueriesStream() string { return n.upper() + "_QUERIES" }

// DLQStream holds dead-lettered jobs (FLEET_DLQ).
func (n Names) DLQStream() string { return n.upper() + "_DLQ" }

// AdvisoryStream keeps max-delivery advisories for the dispatcher (FLEET_ADVISORIES),
// so none are lost while the dispatcher is down.
func (n Names) AdvisoryStream() string { return n.upper() + "_ADVISORIES" }

// Consumer is the durable work consumer name.
func (n Names) Consumer() string { return ConsumerName }

// JobSubject is where a tenant's jobs are published: <prefix>.jobs.<tenant>.
func (n Names) JobSubject(tenant string) string { return n.p() + ".jobs." + tenant }

// JobsWildcard matches every job subject: <prefix>.jobs.>.
func (n Names) JobsWildcard() string { return n.p() + ".jobs.>" }

// QueryMsg is the subject carrying one message per agent stdout line.
func (n Names) QueryMsg(tenant, id string) string { return n.query(tenant, id) + ".msg" }

// QueryStatus is the subject carrying lifecycle events.
func (n Names) QueryStatus(tenant, id string) string { return n.query(tenant, id) + ".status" }

// QueryCtl is the control subject ({"op":"cancel"}).
func (n Names) QueryCtl(tenant, id string) string { return n.query(tenant, id) + ".ctl" }

// QueryArtifact is the subject of a workspace job's artifact manifest (docs/workspaces.md).
func (n Names) QueryArtifact(tenant, id string) string { return n.query(tenant, id) + ".artifact" }

// QueryModel is the subject of a query's model calls, one JSON object per
// call the model gateway forwarded (docs/gateway.md).
func (n Names) QueryModel(tenant, id string) string { return n.query(tenant, id) + ".model" }

// QuerySetup carries a job's setup script output, one message per line (docs/warm.md).
func (n Names) QuerySetup(tenant, id string) string { return n.query(tenant, id) + ".setup" }

// QueryEgress carries a contained run's refused connections, one JSON
// object {"host","port","allowed":false} per refused (host, port) (docs/contained.md).
func (n Names) QueryEgress(tenant, id string) string { return n.query(tenant, id) + ".egress" }

// QueryAll matches every subject of one query (.msg, .status, .ctl, .artifact, .model, .setup, .egress).
func (n Names) QueryAll(tenant, id string) string { return n.query(tenant, id) + ".>" }

// QueriesWildcard matches every per-query subject: <prefix>.query.>.
func (n Names) QueriesWildcard() string { return n.p() + ".query.>" }

// StatusWildcard matches every status subject: <prefix>.query.*.*.status.
func (n Names) StatusWildcard() string { return n.p() + ".query.*.*.status" }

// CtlWildcard matches every control subject: <prefix>.query.*.*.ctl.
func (n Names) CtlWildcard() string { return n.p() + ".query.*.*.ctl" }

func (n Names) query(tenant, id string) string { return n.p() + ".query." + tenant + "." + id }

// APISubmit is the dispatcher's submit endpoint.
func (n Names) APISubmit() string { return n.p() + ".api.submit" }

// APICancel is the dispatcher's cancel endpoint.
func (n Names) APICancel() string { return n.p() + ".api.cancel" }

// APIStatus is the dispatcher's status endpoint.
func (n Names) APIStatus() string { return n.p() + ".api.status" }

// APIList is the dispatcher's list endpoint (recent queries by state).
func (n Names) APIList() string { return n.p() + ".api.list" }

// DLQ is where dead-lettered jobs of a tenant are copied: <prefix>.dlq.<tenant>.
func (n Names) DLQ(tenant string) string { return n.p() + ".dlq." + tenant }

// DLQWildcard matches every dead-letter subject.
func (n Names) DLQWildcard() string { return n.p() + ".dlq.>" }

// MaxDeliveriesAdvisory is the server advisory subject published when a job
// reached MaxDeliver on the work consumer.
func (n Names) MaxDeliveriesAdvisory() string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + n.JobsStream() + "." + ConsumerName
}

// StatusBucket is the JetStream KV bucket the nats:// storage backend uses for status records.
func (n Names) StatusBucket() string { return n.upper() + "_STATUS" }

// ObjectBucket is the JetStream Object Store bucket the nats:// storage backend uses for transcripts.
func (n Names) ObjectBucket() string { return n.upper() + "_TRANSCRIPTS" }

// ParseJobSubject returns the tenant of a job subject <prefix>.jobs.<tenant>.
//
// An admitted job's subject <prefix>.work.<tenant> is read the same way, so
// a worker handles both.
func (n Names) ParseJobSubject(subject string) (tenant string, err error) {
	rest, ok := strings.CutPrefix(subject, n.p()+".jobs.")
	if !ok {
		rest, ok = strings.CutPrefix(subject, n.p()+".work.")
	}
	if !ok || rest == "" || strings.Contains(rest, ".") {
		return "", fmt.Errorf("%w: subject %q is not %s.jobs.<tenant>", ErrInvalidJob, subject, n.p())
	}
	if !ValidTenant(rest) {
		return "", &ValidationError{Field: "subject", Reason: fmt.Sprintf("tenant %q in subject does not match %s", rest, TenantPattern)}
	}
	return rest, nil
}

// ParseQuerySubject splits <prefix>.query.<tenant>.<id>.<kind>. ok is false
// unless tenant matches TenantPattern, id matches IDPattern and kind is not
// empty.
func (n Names) ParseQuerySubject(subject string) (tenant, id, kind string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.p()+".query.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || !ValidTenant(parts[0]) || !ValidID(parts[1]) || parts[2] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}
