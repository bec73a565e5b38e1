// Package pull asks a JetStream pull consumer for exactly as many messages
// as its caller can take now, in one request, on one subscription that
// lives as long as the Puller.
//
// The worker runs at most Slots jobs and must hold no job it cannot start
// (a held job waits while another worker idles, and counts toward the
// consumer's MaxAckPending). nats.go's iterators do not fit: Messages and
// Consume keep a buffer filled whatever the caller can take (prefetch),
// and Fetch subscribes and unsubscribes an inbox per request. The worker
// used Messages with PullMaxMessages(1) — one pull request per job — and
// now asks, whenever slots free, for free slots minus jobs already asked
// for, in one request (Ask).
//
// # The protocol
//
// A request is a publish on $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
// with the inbox as reply subject and {"batch","expires","idle_heartbeat"}
// as body. The server delivers up to batch messages to the inbox, each
// with its ack reply subject, and status messages without payload: 100
// (idle heartbeat, while the request waits), 408 (the request expired;
// Nats-Pending-Messages says how many it did not fill) and 409 (ended
// otherwise: leadership change, max waiting, consumer deleted). Pending
// counts what was asked for and not yet delivered or reported unfilled.
// When nothing at all has come for two heartbeats while something is
// pending (a consumer leader lost the requests, a reconnect), Lost forgets
// them so the caller asks again; a job that still arrives for a forgotten
// request when the caller has no room is the caller's to hand back (Nak).
//
// Jobs are returned as jetstream.Msg (Job), acked, nak'ed, terminated and
// marked in progress on their reply subject exactly as nats.go's own
// messages are (+ACK, -NAK with an optional delay, +TERM with an optional
// reason, +WPI; DoubleAck waits for the server's reply).
package pull
