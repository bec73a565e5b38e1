// Package natsstore implements storage.Store on NATS JetStream, the nats://
// backend: no service besides the NATS server the fleet already runs.
//
//   - KV (NewKV) keeps small records in a JetStream Key-Value bucket; the
//     fleet uses it for status records (bucket FLEET_STATUS). It implements
//     storage.Creator with kv.Create. Values are limited by the server's
//     max_payload (1 MiB by default); larger ones fail with storage.ErrTooLarge.
//   - Objects (NewObjects) keeps objects of any size in a JetStream Object
//     Store bucket, chunked by nats.go; the fleet uses it for transcripts and
//     journal chunks (bucket FLEET_TRANSCRIPTS). It implements
//     storage.StreamPutter; it does not implement storage.Creator, because
//     the Object Store has no create-if-absent. The object names are also
//     kept in a Key-Value bucket, the name index (NamesBucket: the bucket's
//     name with "_NAMES"), so that List reads only what is under its prefix.
//
// # Buckets
//
// The constructors open the bucket if it exists, whatever its settings (so an
// operator may create it first with replicas, limits or placement), and
// create it with file storage and the given replicas if it does not. Start
// order between processes does not matter: a lost creation race is retried as
// an open. WithReplicas(n) also raises an existing bucket (its stream, and
// the name index's) that has fewer than n replicas, keeping its other
// settings, so buckets a worker made with one replica before the
// dispatcher started follow the dispatcher's --replicas; a bucket never
// loses replicas here.
//
// # Keys
//
// A KV key is a NATS subject, where '.' separates tokens. KV maps a store key
// to a KV key by swapping '/' and '.': "status/t/q1.json" is stored as
// "status.t.q1/json". The mapping is one to one on valid keys (segments are
// never empty, so no "..", and a key never starts or ends with '/'), keeps
// every key a valid KV key, and turns our '/' segments into subject tokens, so
// List of a prefix ending in '/' is a server-side subject filter
// ("status.t.>"). Object names are free-form in the Object Store and are the
// store keys unchanged.
//
// # Consistency and cost
//
// Both are strongly consistent: a Put acknowledged by JetStream is seen by
// every later Get and List.
//
// The Object Store has no server-side name filter: listing it reads the
// metadata of every object in the bucket. The archiver lists a query's
// journal chunks for every query it archives, so that cost grew with every
// transcript ever stored. Objects.List therefore reads the name index with
// a subject filter, as KV.List does, and then reads the metadata of each
// name it found, to keep only the names that are objects. Its cost is the
// number of names under the prefix, whatever else the bucket holds.
//
// Put writes the name before the object and Delete removes it after the
// object, so every stored object is in the index. A name whose object is
// missing (a Put that failed after writing the name, or a Delete that
// failed before removing it) is skipped by List. NewObjects fills the index
// from the objects already stored until one fill has finished (a marker key
// then says so), so a bucket written before the index existed keeps
// working. A process of such an
// older version that still writes objects afterwards does not index them.
// Upgrade every process that writes to a bucket together.
//
// # Errors and deadlines
//
// Errors wrap storage.ErrNotFound, ErrExists, ErrInvalidKey and ErrTooLarge
// as the storage package documents. Errors that mean "NATS or JetStream is
// not reachable right now" (no responders, timeouts, a closed or
// reconnecting connection) also wrap storage.ErrUnavailable, so callers can
// retry them. A write that failed so is not known to have failed: nats.go
// keeps what it could not send (or had not flushed) when the connection
// dropped and sends it once it reconnects, before anything newer, so the
// write may still land then. Retrying it with the same value, as the
// journal and the archiver do, is safe. A call whose context has no deadline gets DefaultTimeout: an
// Object Store Get without a deadline can leak when the server stalls
// (nats.go issue 1848).
//
// Close does not close the NATS connection, which belongs to the caller.
package natsstore
