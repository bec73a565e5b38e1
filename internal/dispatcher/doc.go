// Package dispatcher is the fleet's control service: it provisions the
// streams and the work consumer (idempotently, so start order with workers
// does not matter), answers <prefix>.api.{submit,cancel,status,list}, keeps
// the status index in storage from the status events in FLEET_QUERIES (so
// status and ls work after restarts), and turns max-delivery advisories into
// dead letters: the job is copied to <prefix>.dlq.<tenant>, its query ends
// with a synthetic result and a failed status, and it is removed from the
// work queue.
//
// Several dispatchers may run at once: API requests are served by a queue
// group, and the index and dead-letter consumers are durable and shared.
//
// # Parts
//
// The Service owns its parts: it builds them in New, starts them in Start
// (in this order) and stops them in Stop (in the reverse order). Each is a
// type of its own:
//
//   - statusIndex (index.go): the status index, a batched writer of status
//     records, and lookup (the index, then the stream);
//   - deadLetters (deadletter.go): max-delivery advisories turned into
//     dead letters, and their listing;
//   - sessions (sessions.go): parked sessions resumed, cancelled and
//     expired;
//   - endpoints (micro.go): the micro service whose endpoints decode a
//     request (decode.go) and answer it with api (api.go), whose methods
//     take decoded requests, so another service serving the same requests
//     reuses them;
//   - the admitter (internal/admission), last: a stopped admitter does not
//     start again, so nothing that can fail starts after it.
//
// queuedCancel (cancel.go) and ender (ending.go) are the API's and the
// dead letters' helpers for ending a query no worker will end.
//
// The command that builds the Service (cmd/dispatcher serve) starts and
// stops it, and no part of it: the rule is that whoever builds a service
// starts and stops it (pkg/startstop).
package dispatcher
