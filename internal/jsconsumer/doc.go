// Package jsconsumer gives the fleet's short-lived readers of
// FLEET_QUERIES (a tail, a transcript repair, a session's input log) one
// way to open an ordered consumer and to give it back.
//
// nats-server (2.11 and later) allows 1,000 consumers per stream unless the
// stream or the account says otherwise (jetstream default_max_consumers),
// and an ordered consumer nobody deletes stays on the server until its
// inactivity threshold (5 minutes by default in nats.go). One reader per
// finished query would so exhaust the stream within minutes on a busy
// fleet, after which every tail fails with "maximum consumers limit
// reached" (the 1,000-job soak found it). Ordered opens a consumer with a
// short inactivity threshold (InactiveThreshold, the backstop when a
// process dies) and Release deletes it as soon as its reader is done.
package jsconsumer
