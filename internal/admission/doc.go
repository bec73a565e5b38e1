// Package admission decides which queued job runs next (docs/admission.md): exact
// per-tenant caps, fair share by weight, budgets per window and rate-limit
// pauses, in front of the one work consumer that keeps the exact fleet cap.
//
// # Flow
//
// Producers publish on <prefix>.jobs.<tenant> as before; FLEET_JOBS stores
// the job there. The work consumer "workers" reads only <prefix>.work.>.
// The admitter moves each job it admits: it copies the job to
// <prefix>.work.<tenant> (same body and headers, Nats-Msg-Id
// "_admit.<seq>", header Fleet-Job-Seq with the submission's sequence) and
// then removes the original. Only the dispatcher's NATS user may publish on
// <prefix>.work.> (deploy/nats/accounts.conf), so producers cannot bypass
// admission.
//
// # Exactness
//
// The work subjects are the admitter's ledger: a job stays on
// <prefix>.work.<tenant> from admission until a worker acks or terminates
// it, or the dead-letter handler removes it. So the runs of a tenant never
// exceed its messages there, and a pass counts those from the stream itself
// (stream info with a subject filter) before it admits anything. Nothing is
// kept only in the admitter's memory: a standby that takes over reads the
// same counts, a crashed worker's job keeps its tenant's slot until it is
// redelivered and finishes (as it keeps its fleet slot under MaxAckPending),
// and a job handed back (Nak) stays counted. No lease per run is needed and
// workers need no change beyond reading Fleet-Job-Seq.
//
// A pass removes the originals it copied at its end, with one purge per
// tenant subject up to the next job it would take (jobs leave a subject in
// order, so all below were copied), not one delete per job. A copy and its
// removal are not atomic: an admitter that dies between them leaves the
// job on both subjects. The next admitter copies it again under the same
// Nats-Msg-Id, which the stream drops as a duplicate (within the dedupe
// window, default 2m, far longer than a takeover and a pass), then purges
// the original. So a job is admitted once and never lost.
//
// The admitter reads each job it moves with a direct get (FLEET_JOBS
// allows them): on a replicated stream a replica may answer from a state
// that lags, which can only delay a job (not there yet) or return one
// already moved, whose copy the same dedupe drops.
//
// # Leadership
//
// Every dispatcher runs an Admitter; one admits. The lease is the key
// "leader" in the KV bucket FLEET_ADMITTER, whose TTL (LeaseTTL, 5s by
// default) removes it unless renewed (every LeaseTTL/5). Others try to
// create it every LeaseTTL/5, so one takes over at most about 1.2 x LeaseTTL
// after the leader died. The leader admits only within LeaseTTL/2 of its
// last renewal (measured before the renewal was sent) so that it has stopped
// before anyone else can hold the lease. A dispatcher that stops gracefully
// deletes the lease at once.
//
// # Wake-ups
//
// The leader passes when a job is published (a core subscription on
// <prefix>.jobs.>), when a status other than queued is (a slot may have
// freed), and every Config.Tick (200ms). The core copy of a job can arrive
// before the stream has stored it; a pass after such a wake-up that finds
// nothing stored since the last one (FLEET_JOBS' last sequence, its own
// copies aside) looks again after 1ms, doubling up to 64ms, so the job
// does not wait for the tick. A run's end is the same race the other way
// round: the worker publishes the terminal (or parked) status before it
// acks the work message, and the ack is what frees the slot a pass
// counts. So a pass after such a wake-up that leaves jobs waiting and
// admits none looks again on the same schedule, but doubling on up to the
// tick or 2s, whichever is less (a worker on a busy host can take longer
// than 64ms from one to the other): under a tenant's cap the next job
// starts about as soon as the previous one is acked.
//
// # Fair share
//
// Among tenants with queued jobs that the Policy admits, free slots go by
// deficit round robin with the tenant's weight as its quantum (see drr). A
// tenant new to the ring joins at its end, so it waits at most one round:
// with weights 1, another tenant's 10,000 queued jobs delay its first by at
// most one slot turnover. A tenant held by its cap, budget or a pause is
// passed over and keeps no deficit.
//
// # Budgets and rate limits
//
// The dispatcher's status index, which reads every status event anyway,
// hands each batch to RecordSpend once it has stored it (earlier versions
// read the events a second time with a durable consumer, dispatcher-spend,
// which Start now removes). RecordSpend adds the batch's terminal results'
// total_cost_usd to spend.<tenant>.<window> in the KV bucket
// FLEET_ADMISSION, one compare-and-set per tenant and window. Windows are
// aligned to multiples of budget_window since the Unix epoch. An event
// whose write failed is delivered again; a write whose reply was lost is
// counted again then (at-least-once), which errs toward stopping early.
//
// That record comes a moment after the run's end, while the slot the run
// frees (its worker acks right after the terminal status) is seen at once.
// So the leader also counts the cost of each terminal result it sees on
// the status subjects against its tenant's budget straight away (seenCost),
// until the window's recorded spend has grown by that cost, or for at most
// 30 s: a result's cost holds its tenant's next job from the moment it
// ends, not only once it is recorded (TestAdmissionBudgetCountsAResultAsItEnds).
//
// The leader does not read every agent line: a worker forwards only the
// lines that may report a rate limit (protocol.MayReportRateLimit, a byte
// search for "rate_limit" or a non-null api_error_status) as core messages on
// <prefix>.ratelimit.<tenant>, and the leader subscribes there. (Earlier
// versions subscribed to <prefix>.query.*.*.msg, so the leader received
// the whole fleet's output; a worker older than this forwards nothing,
// and its agents' rate limits pause no tenant until it is upgraded.)
// A rate_limit_event with rate_limit_info.status "rejected" pauses its
// tenant until resetsAt; a result with api_error_status 429 or an assistant
// error "rate_limit" pauses it for RateLimitPause. Pauses are stored as
// pause.<tenant> in FLEET_ADMISSION, so a new leader keeps them. A line
// forwarded while no dispatcher leads is not seen.
//
// # Why a job waits
//
// After a pass the leader publishes a queued status for the first
// Announce (5) jobs of every tenant that still waits, with reason
// (budget, rate_limited, tenant_cap, fleet_cap, checked in that order)
// and position (1 = next): at once for a job's first announcement and
// when its reason changed, a new position with the same reason at most
// once a second per job. A tenant's waiting jobs are looked at in at most
// one pass every 200ms; the tick makes such a pass happen while jobs
// wait. (A pass runs for nearly every job submitted and every run that
// ends. Under a draining backlog, announcing in each pass gave many jobs a
// queued status a few milliseconds before their admission, and each
// admission moved every announced job up a place: up to Announce statuses
// per admitted job, each stored, indexed and sent to every status
// subscriber.)
//
// # Sessions
//
// A live session holds its job unacked, so it stays on the work subject and
// counts against its tenant's cap; a parked session has acked its job and
// counts nothing; its continuation is a new job on <prefix>.jobs.<tenant>
// and is admitted like any other. Nothing here needs to know about
// sessions.
//
// # Lifecycle
//
// Admitter uses pkg/startstop: Start returns once the buckets are
// open, the settings loaded and the goroutines running (a Start that fails
// undoes what it began and may be retried); Stop hands the lease back and
// waits for every goroutine; a second Start, a Start after Stop and a
// second Stop answer as startstop says. The dispatcher's Service, which
// builds it as one of its parts, starts and stops it.
//
// # Files
//
//   - admitter.go: Config, the Admitter and its lifecycle;
//   - lease.go: leadership, the lease and its renewals, the wake-ups;
//   - pass.go: one term of leadership and its passes (the DRR pass, drr.go);
//   - places.go: queue places, the queued statuses that say why a job waits;
//   - budget.go: the book of settings, spend and pauses, and RecordSpend;
//   - ratelimit.go: rate-limit pauses from forwarded lines;
//   - policy.go, store.go: the policy and the buckets' records.
package admission
