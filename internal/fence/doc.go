// Package fence makes every attempt of a query a single writer of that
// query's .msg and .status subjects, enforced by the JetStream server, so
// that two attempts (a zombie and its successor, or a worker and the
// dispatcher's dead-letter path) can never both append, whatever the order
// in which they learn about each other and however long an outage lasts.
//
// # The token
//
// The fence token of a query is the FLEET_QUERIES stream sequence of the
// last message on its .status subject. Every status an attempt publishes is
// a compare-and-set on that subject (Nats-Expected-Last-Subject-Sequence =
// the token it holds); every line it publishes on .msg carries the same
// check against the .status subject
// (Nats-Expected-Last-Subject-Sequence-Subject = the .status subject), so a
// line is stored only while the last status is still the attempt's own. An
// attempt starts by claiming the query: it reads the last status (from the
// stream leader, never a possibly stale replica), decides (Decide) and
// publishes its first status with the token it read. Leader reads use the
// JSON API (STREAM.MSG.GET); on a stream of one replica, whose only server
// is its leader, LastMsgVia reads with a direct get instead, which answers
// the same in binary at a fraction of the cost. From then on:
//
//   - a later attempt's claim moves the token: every line and status the
//     older attempt sends afterwards is rejected by the server ("wrong last
//     sequence"), which is how the older attempt learns it was fenced,
//     even if it never saw the new status on its subscription;
//   - a terminal status moves the token too: a later attempt's claim fails
//     its compare-and-set, it reads the terminal status back and acks the
//     job without running it, so there is exactly one terminal status per
//     submission;
//   - after its claim is stored an attempt reads the last line of .msg (from
//     the leader): no older attempt can store a line after that, so the
//     Fleet-Seq it continues from is final and Fleet-Seq stays unique and
//     contiguous.
//
// A lost PubAck is resolved by reading back: when a compare-and-set fails
// and the last status is the attempt's own (same submission, attempt,
// worker and state), it was stored and the new token is adopted; a line
// whose publish failed is looked up the same way (the last .msg line after
// the attempt's claim can only be the attempt's own, so its Fleet-Seq says
// how much of the attempt is stored). Nats-Msg-Id (tenant.id.attempt.seq)
// still dedupes a republish inside the stream's duplicate window, which
// covers reads served before a new leader caught up; the read-back covers
// outages longer than the window.
//
// # Cost
//
// One read and one synchronous publish per attempt start (two for a retry,
// which also announces "retrying"), one compare-and-set for the terminal
// status. The worker reads the last status together with the query's last
// control message (LastMsgsVia: one multi-last direct get on a stream of
// one replica) and hands it to the claim (Use). Lines stay pipelined on a stream with one replica: the server
// checks them in order against its store. On a replicated stream the server
// rejects a second message checked against the same subject while the
// first is still being proposed, so the worker keeps one line in flight per
// query there (lines of different queries still go in parallel).
//
// # Decisions
//
// Decide maps the last status of a query to what an attempt may do:
// Proceed (nothing, a queued status, an earlier attempt's or an earlier
// submission's status, or the attempt's own), Finished (a terminal status
// of the same submission: ack the job, run nothing), Superseded (a later
// attempt of the same submission: stop, leave the job message to it) or
// Replaced (a newer submission of the same id: stop, and terminate the job
// message, since no attempt of this submission will ever run; left alone,
// it would be redelivered until max deliveries dead-lettered a query that
// ran).
package fence
