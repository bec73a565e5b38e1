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
// The Service composes three parts, one file each:
//
//   - api.go: the request handlers (submit, cancel, status, list);
//   - index.go: the status index, a batched writer of status records;
//   - deadletter.go: max-delivery advisories turned into dead letters.
//
// dispatcher.go wires them: Start provisions and starts each part; Stop
// drains the subscriptions and consumers, then waits for the index writer.
package dispatcher
