package tenancy

import (
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// respThreshold is how long a tenant's request through an import may keep
// getting replies: a pull on FLEET_QUERIES answers with a stream of
// messages until its expiry.
const respThreshold = 5 * time.Minute

// JSAPIPrefix is the JetStream API prefix tenants use
// (jetstream.NewWithAPIPrefix, nats --js-api-prefix): their accounts
// import the fleet's JetStream API under it. Not the default $JS.API,
// which nats-server itself answers in every account ("JetStream not
// enabled for account"), racing an import of the same subjects.
const JSAPIPrefix = "$JS.FLEET.API"

// InboxPrefix is the reply-inbox prefix of a tenant's clients (the CLI
// sets it itself). A tenant's account is its own, so its replies are
// private either way; the default _INBOX. is allowed too.
func InboxPrefix(tenant string) string { return "_INBOX_" + tenant }

// TenantAPISubject is the fleet-side subject of a tenant's API requests:
// <prefix>.tapi.<tenant>.<op>. The dispatcher serves <prefix>.tapi.*.<op>
// and takes the tenant from this subject only.
func TenantAPISubject(prefix, tenant, op string) string { return prefix + ".tapi." + tenant + "." + op }

// TenantJSSubject is the fleet-side subject of a tenant's JetStream API
// request $JS.API.<rest>: <prefix>.tjs.<tenant>.<rest>.
func TenantJSSubject(prefix, tenant, rest string) string {
	return prefix + ".tjs." + tenant + "." + rest
}

// fleetAccount is the FLEET account: unlimited JetStream, and the exports
// tenant accounts import their slices of.
func fleetAccount(pub, prefix string) *jwt.AccountClaims {
	q := protocol.NewNames(prefix).QueriesStream()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = "FLEET"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ac.Exports.Add(
		&jwt.Export{Name: "jobs", Subject: jwt.Subject(TenantSubmitSubject(prefix, "*")), Type: jwt.Service},
		&jwt.Export{Name: "ctl", Subject: jwt.Subject(prefix + ".query.*.*.ctl"), Type: jwt.Service},
		&jwt.Export{Name: "queries", Subject: jwt.Subject(prefix + ".query.>"), Type: jwt.Stream},
		&jwt.Export{Name: "api", Subject: jwt.Subject(prefix + ".tapi.*.>"), Type: jwt.Service},
		&jwt.Export{Name: "jsapi", Subject: jwt.Subject(prefix + ".tjs.*.>"), Type: jwt.Service},
		&jwt.Export{Name: "pull", Subject: jwt.Subject("$JS.API.CONSUMER.MSG.NEXT." + q + ".*"), Type: jwt.Service,
			ResponseType: jwt.ResponseTypeStream, ResponseThreshold: respThreshold},
		&jwt.Export{Name: "direct-get", Subject: jwt.Subject("$JS.API.DIRECT.GET." + q + ".>"), Type: jwt.Service},
	)
	return ac
}

// FleetDurables are the fleet's own durable consumers on FLEET_QUERIES
// (and others'), whose pulls tenants are denied by name: a pull on a
// consumer works by name alone. A test lists the durables a running fleet
// has and fails on one missing here.
var FleetDurables = []string{"dispatcher-status", "dispatcher-sessions", "dispatcher-dlq", "dispatcher-spend", "dispatcher-schedules", "dispatcher-github", "archiver", "workers", "webhooks"}

// tenantAccount is tenant t's account: no JetStream of its own, and only
// its slice of FLEET imported. Its JetStream API ($JS.FLEET.API.…) reaches the
// calls a reader of FLEET_QUERIES needs: consumer create, info, delete and
// the body form of message gets through the dispatcher's checks
// (<p>.tjs.T.…); pulls and direct gets by subject straight from FLEET.
func tenantAccount(pub, t, fleet, prefix string) *jwt.AccountClaims {
	q := protocol.NewNames(prefix).QueriesStream()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = "tenant-" + t
	ac.Tags.Add("tenant:" + t)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{}
	svc := func(name, remote, local string) *jwt.Import {
		return &jwt.Import{Name: name, Account: fleet, Subject: jwt.Subject(remote), LocalSubject: jwt.RenamingSubject(local), Type: jwt.Service}
	}
	proxied := func(name, rest string) *jwt.Import {
		return svc(name, TenantJSSubject(prefix, t, rest), JSAPIPrefix+"."+rest)
	}
	ac.Imports.Add(
		svc("jobs", TenantSubmitSubject(prefix, t), prefix+".jobs."+t),
		&jwt.Import{Name: "ctl", Account: fleet, Subject: jwt.Subject(prefix + ".query." + t + ".*.ctl"), Type: jwt.Service},
		&jwt.Import{Name: "queries", Account: fleet, Subject: jwt.Subject(prefix + ".query." + t + ".>"), Type: jwt.Stream},
		svc("api", TenantAPISubject(prefix, t, ">"), prefix+".api.>"),
		proxied("consumer-create", "CONSUMER.CREATE."+q+".>"),
		proxied("consumer-info", "CONSUMER.INFO."+q+".*"),
		proxied("consumer-delete", "CONSUMER.DELETE."+q+".*"),
		proxied("msg-get", "STREAM.MSG.GET."+q),
		proxied("direct-get-body", "DIRECT.GET."+q),
		svc("pull", "$JS.API.CONSUMER.MSG.NEXT."+q+".*", JSAPIPrefix+".CONSUMER.MSG.NEXT."+q+".*"),
		svc("direct-get", "$JS.API.DIRECT.GET."+q+"."+prefix+".query."+t+".>", JSAPIPrefix+".DIRECT.GET."+q+"."+prefix+".query."+t+".>"),
	)
	return ac
}

// tenantPermissions are a tenant user's: publish jobs, the API, .ctl and
// the JetStream API its account imports, but no pull on the fleet's
// durables; subscribe to its query subjects and its inboxes; $SYS only to
// ask about itself.
func tenantPermissions(t, prefix string) jwt.Permissions {
	q := protocol.NewNames(prefix).QueriesStream()
	var p jwt.Permissions
	p.Pub.Allow.Add(prefix+".jobs."+t, prefix+".api.>", prefix+".query."+t+".*.ctl", JSAPIPrefix+".>", "$SYS.REQ.USER.INFO")
	for _, d := range FleetDurables {
		p.Pub.Deny.Add(JSAPIPrefix + ".CONSUMER.MSG.NEXT." + q + "." + d)
	}
	p.Sub.Allow.Add(prefix+".query."+t+".>", InboxPrefix(t)+".>", "_INBOX.>")
	return p
}

// dispatcherPermissions are the dispatcher's in FLEET: those of
// deploy/nats/accounts.conf, plus the tenants' API and JetStream proxy.
func dispatcherPermissions(prefix string) jwt.Permissions {
	n := protocol.NewNames(prefix)
	q, a, sc := n.QueriesStream(), n.AdvisoryStream(), n.SchedulesStream()
	var p jwt.Permissions
	p.Pub.Allow.Add("$JS.API.>", prefix+".jobs.>", prefix+".work.>", prefix+".query.>", prefix+".dlq.>", prefix+".sched.>",
		"$JS.ACK."+q+".>", "$JS.ACK."+a+".>", "$JS.ACK.*.*."+q+".>", "$JS.ACK.*.*."+a+".>",
		"$JS.ACK."+sc+".>", "$JS.ACK.*.*."+sc+".>", "$O.>", "$KV.>",
		"$SRV.>", prefix+".worker.*.info", prefix+".worker.*.drain", prefix+".api.webhook.>")
	p.Sub.Allow.Add(prefix+".api.>", prefix+".tapi.>", prefix+".tjs.>", prefix+".tsub.*", prefix+".jobs.>", prefix+".query.*.*.status",
		prefix+".query.*.*.msg", prefix+".ratelimit.*", "_INBOX_dispatcher.>", "$SRV.>")
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return p
}

// workerPermissions are a worker's in FLEET, as in deploy/nats/accounts.conf.
// Besides its jobs and its queries' subjects: publish .model (the model
// gateway's metering events) and read its queries' .model history, and
// read (only) the tenant table and the budget windows' spend, which the
// gateway checks a tenant's budget_usd against.
func workerPermissions(prefix string) jwt.Permissions {
	n := protocol.NewNames(prefix)
	j, q, c := n.JobsStream(), n.QueriesStream(), n.Consumer()
	var p jwt.Permissions
	p.Pub.Allow.Add(WorkerBudgetReads(n)...)
	p.Pub.Allow.Add("$JS.API.CONSUMER.CREATE."+q+".*."+prefix+".query.*.*.model", prefix+".query.*.*.model")
	p.Pub.Allow.Add("$JS.API.INFO",
		"$JS.API.CONSUMER.INFO."+j+"."+c, "$JS.API.CONSUMER.MSG.NEXT."+j+"."+c,
		"$JS.ACK."+j+"."+c+".>", "$JS.ACK.*.*."+j+"."+c+".>",
		"$JS.API.STREAM.INFO."+q, "$JS.API.STREAM.MSG.GET."+q,
		"$JS.API.DIRECT.GET."+q, "$JS.API.DIRECT.GET."+q+".>",
		"$JS.API.CONSUMER.CREATE."+q+".*."+prefix+".query.*.*.ctl",
		"$JS.API.CONSUMER.MSG.NEXT."+q+".*", "$JS.API.CONSUMER.INFO."+q+".*", "$JS.API.CONSUMER.DELETE."+q+".*",
		prefix+".query.*.*.msg", prefix+".query.*.*.status", prefix+".query.*.*.artifact", prefix+".query.*.*.egress", prefix+".dlq.>",
		prefix+".ratelimit.*")
	p.Sub.Allow.Add(prefix+".query.*.*.ctl", prefix+".query.*.*.status", "_INBOX_worker.>",
		"$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*.agentfleet-worker", "$SRV.*.agentfleet-worker.>", prefix+".worker.>")
	p.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return p
}

// WorkerBudgetReads are the JetStream API subjects of reading the tenant
// table (KV bucket <PREFIX>_TENANTS) and the budget windows' spend
// (<PREFIX>_ADMISSION): the bucket's info, and its messages by direct or
// API get. Nothing that writes, lists or deletes.
func WorkerBudgetReads(n protocol.Names) []string {
	var out []string
	for _, b := range []string{n.TenantsBucket(), n.AdmissionBucket()} {
		s := "KV_" + b
		out = append(out, "$JS.API.STREAM.INFO."+s, "$JS.API.STREAM.MSG.GET."+s,
			"$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".$KV."+b+".>")
	}
	return out
}
