// Package storage persists what the fleet keeps after a query: its
// transcript (every line the agent wrote, in Fleet-Seq order) and its status
// record. It defines the Store interface every backend implements, the key
// layout, and helpers over any Store: StreamTranscript, MergeTranscript,
// AssembleTranscript, ReadTranscript, PutBatch, PutStatus, PutStatuses,
// GetStatus, ListStatus.
//
// # Keys
//
// A key is a '/'-separated path of segments made of [A-Za-z0-9._=-]; no
// segment is empty, "." or "..", a segment is at most 255 bytes and a key at
// most 480 (ValidateKey, which every backend calls). The layout (keys.go):
//
//	queries/<tenant>/<id>/chunks/<first seq %020d>.<attempt %06d>.ndjson   journal chunks
//	queries/<tenant>/<id>/lines/<seq %020d>.json            a line too large for one NATS message
//	queries/<tenant>/<id>/transcript.ndjson                 the assembled transcript
//	status/<tenant>/<id>.json                               the query's last StatusEvent (JSON)
//
// Status records live apart from query objects, so a status-only backend
// (Workers KV) holds nothing else, and --status-storage can point elsewhere
// than --storage.
//
// # Transcripts
//
// The stream is the log: the archiver (internal/archiver) writes a finished
// query's transcript from its lines in FLEET_QUERIES (StreamTranscript: for
// every seq the highest attempt's line, in seq order), many queries per
// PutBatch. Chunks exist only for lines a worker's journal stored because
// they never reached the stream; MergeTranscript joins them with the
// stream's lines (the higher attempt wins a seq, the stream a tie).
//
// A disk-first journal (pkg/journal) writes all of a query's lines as chunks: each
// chunk holds consecutive raw lines, each ending in "\n", the first with the
// Fleet-Seq in its key. When a query ends, AssembleTranscript merges the
// chunks into transcript.ndjson: lines in seq order, gaps skipped, and where
// two attempts hold the same seq, the higher attempt's line. Chunks are kept
// after assembly, so a late chunk (a crashed worker flushing its journal on
// restart) can be merged by assembling again; assembly is idempotent.
// ReadTranscript returns the transcript, or assembles one on the fly while
// none is written yet.
//
// # Status records
//
// PutStatus keeps the newest event by the rule of Newer (higher attempt,
// then terminal over non-terminal, then time), so events may arrive late or
// out of order without an older one overwriting a terminal state.
// ListStatus returns records newest first. PutStatuses does the same for a
// batch of events in one PutBatch (the dispatcher's status index).
//
// # Backends
//
//   - FS (this package): a local directory, the default (file://./data).
//     Atomic, durable writes (temporary file, fsync, rename, fsync of the
//     directory); Creator, StreamPutter and Batcher (PutBatch: every value
//     to a temporary file, one syncfs, the renames, one syncfs: two syncs
//     per batch however many objects). For one machine, or a shared volume.
//   - natsstore: JetStream KV for status and Object Store for transcripts
//     (nats://), needing nothing but the NATS server.
//   - s3: R2 or any S3 (s3://bucket?endpoint=…), for transcripts at scale.
//   - cfkv: Cloudflare Workers KV (cfkv://account/namespace), for status
//     records read from Workers; eventually consistent (List may lag by up
//     to a minute), values up to 25 MiB.
//
// backends.Open turns a URL into a Store. storagetest.Exercise is the suite
// every backend passes; storagetest.Mem and storagetest.Flaky serve other
// packages' tests.
//
// # Consistency and failures
//
// Every backend writes a key atomically: a reader sees the old value or the
// new one, never a mix, and a failed Put or PutStream leaves the old value.
// FS, NATS and S3 are read-after-write consistent; Workers KV is eventually
// consistent. Errors wrap the sentinels: ErrNotFound (missing key),
// ErrExists (Create of an existing key), ErrInvalidKey (bad key, never worth
// retrying), ErrTooLarge (value over the backend's limit, never worth
// retrying) and ErrUnavailable (the backend cannot be reached now; retry with
// backoff). Every call honours its context.
package storage
