// Package protocol is the wire contract of agentfleet: subject, stream and
// consumer names, the job body and its validation, the status, control and
// API envelopes, and the lossless handling of the agent's stdout lines.
// Every other package speaks to NATS and to storage through these types;
// nothing else spells a subject or parses an agent line.
//
// # Subjects
//
// Names builds every name from one configurable prefix (DefaultPrefix
// "fleet"; PREFIX below is the prefix upper-cased with '-' and '.' turned
// into '_'):
//
//	JobsStream()                PREFIX_JOBS         work-queue stream of jobs
//	QueriesStream()             PREFIX_QUERIES      every per-query subject, limits retention
//	DLQStream()                 PREFIX_DLQ          dead-lettered jobs
//	AdvisoryStream()            PREFIX_ADVISORIES   max-delivery advisories, kept for the dispatcher
//	Consumer()                  workers             the durable pull consumer of PREFIX_JOBS
//	JobSubject(t)               fleet.jobs.<t>      where a tenant's jobs are published
//	JobsWildcard()              fleet.jobs.>
//	QueryMsg(t, id)             fleet.query.<t>.<id>.msg     one message per agent stdout line
//	QueryStatus(t, id)          fleet.query.<t>.<id>.status  lifecycle events (StatusEvent)
//	QueryCtl(t, id)             fleet.query.<t>.<id>.ctl     control input (CtlOp)
//	QueryArtifact(t, id)        fleet.query.<t>.<id>.artifact  a workspace job's manifest (Artifact, docs/workspaces.md)
//	QueryAll(t, id)             fleet.query.<t>.<id>.>
//	QueriesWildcard()           fleet.query.>
//	StatusWildcard()            fleet.query.*.*.status
//	CtlWildcard()               fleet.query.*.*.ctl
//	APISubmit/APICancel/APIStatus/APIList()  fleet.api.submit|cancel|status|list
//	DLQ(t)                      fleet.dlq.<t>
//	DLQWildcard()               fleet.dlq.>
//	MaxDeliveriesAdvisory()     $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.PREFIX_JOBS.workers
//	StatusBucket()              PREFIX_STATUS       KV bucket of the nats:// storage backend
//	ObjectBucket()              PREFIX_TRANSCRIPTS  object store of the nats:// storage backend
//
// ParseJobSubject and ParseQuerySubject invert the job and query builders;
// both reject a tenant or id that does not match TenantPattern or IDPattern,
// so a name read back from a subject is always safe to build another from.
//
// # Jobs
//
// A job (docs/protocol.md) arrives as JSON, or msgpack when its Content-Type header
// says application/msgpack. DecodeJob picks the codec (CodecFor), rejects a
// body over MaxJobBytes (1 MiB) or that is not an object/map, and turns
// decoding errors into a *ValidationError naming the field path
// ("options.max_turns: must be an integer, got string"). JSON strings that
// are not valid UTF-8 are rejected rather than silently repaired. Unknown
// fields are ignored, for forward compatibility. On failure DecodeJob still
// returns a *Job carrying the id and tenant ProbeIdentity could read, so the
// worker can publish a failed status with code invalid_job.
//
// (*Job).Validate then checks, reporting the first broken rule:
//
//   - id matches IDPattern; required on direct publish (requireID).
//   - tenant matches TenantPattern and equals the subject's tenant when both
//     are given; an empty tenant becomes the subject's, else DefaultTenant.
//   - prompt is non-empty, at most MaxPromptBytes (256 KiB).
//   - sandbox is "", "local" or "cloudflare".
//   - options: model matches ModelPattern; max_turns 1..10000;
//     max_budget_usd finite, > 0 and <= 10000; permission_mode one of
//     default, acceptEdits, bypassPermissions, plan, dontAsk, auto;
//     allowed_tools and disallowed_tools at most 256 entries, each non-empty
//     and not starting with '-'; system_prompt and append_system_prompt at most
//     256 KiB; resume matches ResumePattern (it is passed as --resume=<id>);
//     timeout_s 1..604800; env at most 64 entries with keys matching
//     EnvKeyPattern (the operator's allow-list is enforced by the worker).
//   - metadata at most 64 entries, keys 1..128 bytes, values at most 4 KiB.
//   - every string is valid UTF-8, and strings that reach the agent's
//     arguments or environment contain no NUL byte. model, tool names and
//     resume never start with '-', so none can be taken for a CLI flag; free
//     text (prompt, system prompts) may, so the worker passes it after "--"
//     or in --flag=value form.
//
// An invalid job is never retried. Every decoding and validation error
// satisfies errors.Is(err, ErrInvalidJob).
//
// # Messages
//
// The agent (claude -p --output-format stream-json) writes one JSON object
// per line. The fleet is lossless: the bytes of each line are what is
// published on .msg and stored, never a re-encoding, so unknown types,
// unknown keys, key order and number formatting all survive CLI upgrades.
//
// LineReader splits stdout into lines. It never stops reading (a stalled
// reader would block the child on a full pipe): lines of any size up to its
// cap (DefaultMaxLine, 64 MiB) are returned whole; a longer line is read
// and discarded while counted, and replaced by the marker line
// {"type":"x_fleet_line_too_large","bytes":N,"cap":C}. \r\n is trimmed on
// complete lines only; a final line without a newline is returned before
// io.EOF; non-JSON lines (ANSI noise, debug prints) are returned unchanged.
//
// ParseMessage reads only the header of a line (type, subtype, uuid,
// session_id, parent_tool_use_id), wherever its keys are in the object, and
// never fails: a line that is not a JSON object has JSON false and is still
// relayed. Typed views are decoded on demand (Message.AsResult) and used for
// decisions only, never re-encoded for output. A run's outcome is taken from
// its last result line, and success is !is_error, whatever the subtype.
//
// # Ordering
//
// Lines are relayed in the order read, numbered by the worker with Fleet-Seq
// (1, 2, 3 … across all attempts of a query; Nats-Msg-Id <tenant>.<id>.<attempt>.<seq>
// makes republishing idempotent). A line too large for one NATS message is
// stored whole and replaced on .msg by a {"type":"x_fleet_large_line",…}
// pointer with the same sequence number. A retried query's new attempt
// follows the old attempt's lines, after a retrying status. The agent may
// write more than one result line; the last one before EOF decides the
// outcome, and the stream always ends with a result line (synthetic if need
// be).
//
// # Synthetic results
//
// Every query's .msg stream ends with a "type":"result" line (docs/protocol.md). If
// the agent was cancelled, timed out, crashed, could not be started or broke
// an output limit before writing one (or the dispatcher dead-lettered the
// job), the worker or dispatcher appends SyntheticResult: an
// SDK-shaped error_during_execution result with is_error true, zero cost and
// usage, a fresh uuid, errors[0] explaining what happened, and an x_fleet
// object {synthetic, reason, exit_code, signal, stderr_tail}.
// terminal_reason "aborted_streaming" is set only for cancellation, as the
// CLI does for an interrupt. Consumers recognise it with
// Result.XFleet != nil && Result.XFleet.Synthetic.
//
// # Versioning
//
// Status events carry V (SchemaVersion, now 1). Changes are additive:
// new fields are optional and readers ignore unknown fields, in JSON and in
// msgpack, so old and new workers and dispatchers can run side by side
// during a rolling upgrade. A field is never renamed or given a new type
// within one V; a breaking change bumps SchemaVersion and readers must
// accept both versions until every writer is upgraded. The golden files in
// testdata/ pin the encoding of every wire type: a test fails before a
// deployed peer would. Agent lines are not versioned by the fleet at all;
// they are relayed as written and parsed leniently.
package protocol
