// Package archiver makes a finished query's stored transcript complete from
// the FLEET_QUERIES stream, without the worker that produced it.
//
// A worker journals every line and copies its journal to storage; a worker
// host that is lost (SIGKILL, a container with an ephemeral disk) never
// copies the tail it had not flushed yet, and lines a worker could not
// journal (its disk was full) reach only the stream. Every line the fleet
// acknowledged is in the stream, though, so the archiver, run by
// `dispatcher serve`, repairs transcripts from there:
//
//   - it reads the status events with a durable consumer ("archiver", shared
//     by every dispatcher, so each event is handled once);
//   - a terminal status is looked at Config.Delay after it was first
//     delivered (NakWithDelay: JetStream is the timer, so a dispatcher
//     restart loses nothing), which leaves the worker time to write the
//     transcript itself on the happy path;
//   - then it reads the query's .msg lines from the stream and calls
//     storage.RepairTranscript, which compares them with the stored
//     transcript and writes only the lines no chunk holds, as chunks of
//     their own, then re-assembles the transcript;
//   - repairs run side by side (Config.Workers, 8), so a slow or stuck
//     one never holds up the others; each is bounded by
//     Config.ReadTimeout, and one that fails, or whose read stalls (two
//     empty fetches while lines remain, as across a server restart), is
//     retried with NakWithDelay from 1s doubling to 30s.
//
// Lines too large for NATS travel as x_fleet_large_line pointers; the
// archiver takes their content from storage (storage.LineKey) and leaves a
// seq alone when that is missing too.
//
// This is the first step of "the stream is the log" (issue 12): the same
// loop, given batches and a queue group, can take over writing every
// transcript from the workers.
package archiver
