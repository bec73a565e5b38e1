// Package schedule keeps a tenant's schedules in JetStream and turns their
// firings into jobs.
//
// A schedule is one message on <prefix>.sched.<tenant>.<name> in the
// stream <PREFIX>_SCHEDULES: its body is the definition (when, and the
// job to submit), and while the schedule is active the message carries
// nats-server's message-schedule headers (Nats-Schedule,
// Nats-Schedule-Target, Nats-Schedule-Time-Zone). The server itself fires
// it: at each time it stores a copy of the definition on
// <prefix>.fire.<tenant>.<name>. No timer of ours runs, so a schedule
// survives restarts of the dispatcher and of the server, and fails over
// with a cluster.
//
// A paused schedule is the same message without the schedule headers;
// removing one purges both subjects. Each subject keeps its latest message
// only (a rollup on every write), so the stream holds one definition and
// one firing per schedule.
//
// The Firer reads the firings through the durable consumer
// "dispatcher-schedules" and submits each as a job whose id is
// "<name>-<fire time as yyyymmddThhmmssZ>" (the time the server stored
// the firing, UTC, to the second): a firing delivered twice is the same
// job, which the jobs stream's de-duplication drops. Firings that came
// while no dispatcher ran are delivered when one starts; the server
// itself fires a repeating schedule that missed several times only once.
package schedule
