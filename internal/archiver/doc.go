// Package archiver writes every finished query's transcript from the
// FLEET_QUERIES stream: the stream is the log.
//
// A line is durable once FLEET_QUERIES acknowledged it. Workers no longer
// store transcripts: their journal (pkg/journal, memory first) holds a line
// only until the stream acknowledges it, and stores to storage only the
// lines that never reached the stream (spilled to its disk while NATS was
// away, then put as chunks). The archiver, which `dispatcher serve` builds,
// starts and stops (the pkg/startstop lifecycle), turns the stream
// into transcripts:
//
//   - it reads the status events with one durable consumer ("archiver") that
//     every dispatcher shares, so the work spreads over the dispatchers and
//     each event is handled once; a dispatcher restart loses nothing (the
//     consumer keeps its place);
//   - it gathers terminal statuses into batches (Config.Batch, up to
//     Config.Linger after the first), and for each query reads its .msg
//     lines (transcript.Reader): the first 256 with one batched direct get, the rest,
//     if any, through one ephemeral consumer (in memory, no acks, deleted
//     after the read), whose deliveries carry none of the six headers the
//     server adds to every line a direct get returns; if no consumer can be
//     made, direct gets of 1,000 lines read the rest; a worker's transcript.Reader
//     (merging chunks it stored late) uses direct gets only;
//     a terminal status is published only after every line of its attempt
//     is stored, so the lines are all there; when the status says a higher
//     last seq than the read found (a replica behind), it retries;
//   - the transcript is every seq's line of the highest attempt, in
//     Fleet-Seq order (storage.StreamTranscript); the batch's transcripts
//     are written with one storage.PutBatch (on FS: two filesystem syncs for
//     the whole batch instead of fsyncs per file and directory; one object
//     write per transcript on NATS, S3 and R2);
//   - then it lists the query's chunk objects; where a journal stored some,
//     it merges them in (storage.MergeTranscript) and writes again, until no
//     chunk arrives during a merge; a journal that stores chunks later
//     merges them itself (transcript.Reader.MergeIfArchived, the journal's hooks);
//   - batches are archived side by side (Config.Workers, 8), so a slow or
//     stuck one (a slow bucket, a read across a server restart) never holds
//     up the others; each is bounded by Config.ReadTimeout;
//   - events are acked after their transcript is written; a failure naks
//     them for a retry after Config.Retry, doubling with each delivery up
//     to 30s.
//
// Lines too large for NATS travel as x_fleet_large_line pointers; their
// content is in storage (storage.LineKey, put by the worker's journal,
// which spills a large line at once). A pointer whose line is not in
// storage yet makes the archiver retry, up to Config.MaxTries deliveries,
// after which it writes the transcript without that line and logs an error
// (a worker host lost before it stored the line).
//
// This makes a stored transcript complete without the worker that produced
// it: TestLostWorkerTranscriptIsCompleted.
package archiver
