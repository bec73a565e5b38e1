// Package journal is the worker's local, durable, ordered log of every line an
// agent writes to stdout. Each line is appended to the journal before it is
// published to NATS; a flusher then copies the journal to storage in order,
// retrying with backoff. A storage outage only delays persistence (the
// backlog grows on local disk, not in memory: a flusher holds at most one
// chunk, and a closed log waiting for storage keeps no file open); it never
// loses or reorders a line and never blocks the agent's output. A worker that restarts after a
// crash flushes what it journaled before dying.
//
// Usage (the worker):
//
//	j, err := journal.New(journal.Config{Dir: dir, Store: store, AssembleFunc: assemble})
//	err = j.Start(ctx)              // recovers logs left by a crashed process
//	l, err := j.Open(tenant, id, attempt)
//	err = l.Append(seq, line)       // for every stdout line, before publishing it
//	err = l.Close(final)            // final=true when the query ended here
//	err = j.Stop(ctx)               // last flush, bounded by ctx
//
// # Storage objects
//
// Lines are written in chunks to storage.ChunkKey(tenant, id, firstSeq,
// attempt): the raw lines of consecutive seqs, each followed by "\n". A new
// chunk starts at a seq gap, once Config.ChunkBytes is reached (a longer
// single line makes a chunk of its own), or when the pending lines are
// flushed because the oldest of them is Config.FlushInterval old, the log
// was closed, or the journal is stopping. Lines longer than
// Config.LargeLineBytes are also stored whole under storage.LineKey(tenant,
// id, seq). When a log closed with final=true is fully flushed, the flusher
// calls Config.AssembleFunc (storage.AssembleTranscript in the worker), which
// concatenates the chunks into the transcript.
//
// # Ordering
//
// Within a log, Append requires strictly increasing seqs (Fleet-Seq), the
// WAL holds the lines in that order, and one flusher per log puts the chunks
// one after another in that order: a chunk is put only after every earlier
// chunk of the log succeeded. Chunk keys sort by first seq, so the stored
// chunks read in key order give the lines in Fleet-Seq order, attempts
// included. Before assembling a final log, the flusher waits until the
// query's earlier attempts in this journal are persisted (and refuses to
// assemble if one of them gave up). Attempts that ran on another worker which
// crashed are flushed when that worker restarts; if that happens after the
// final attempt was assembled, those chunks are in storage but not in the
// transcript.
//
// Every chunk is idempotent: before its first Put, its seq range is recorded
// in the state file, and every later Put of it (a retry, or recovery after a
// crash) sends the same key and bytes. Chunk boundaries therefore never
// shift, and storage never holds two different chunks covering the same line
// of an attempt (unless a state file is lost or damaged: recovery then
// re-puts the whole log with fresh boundaries and logs an error).
//
// # Durability
//
// Append writes the record with one write call (the kernel's page cache);
// whether it also waits for stable storage depends on Config.Fsync:
//
//   - FsyncInterval (default): a background goroutine fsyncs every log with
//     new lines once per Config.FsyncInterval (100ms), a group commit Append
//     does not wait for. A process crash (SIGKILL, panic, OOM kill) loses
//     nothing that Append returned for; a power loss or kernel crash may lose
//     the last FsyncInterval of lines.
//   - FsyncAlways: Append fsyncs before it returns (and Open fsyncs the new
//     directories). Neither a process crash nor a power loss loses a line
//     Append returned for, at the price of one fsync per line.
//   - FsyncNever: the operating system writes back when it likes (typically
//     within 30s). A process crash loses nothing; a power loss may lose
//     recent lines, or leave zeroed or garbage bytes the recovery skips.
//
// Under every policy, lines already in storage are safe, and a crash in the
// middle of a write leaves at most a torn last record, which recovery
// truncates. Open and Close never wait for the disk except under
// FsyncAlways (there Close fsyncs the WAL and both fsync the state file);
// under FsyncInterval a power loss right after Close may take the lines of
// the last interval, which the flusher would otherwise have persisted a
// moment later. State files are replaced atomically (temporary file, fsync,
// rename, fsync of the directory); the state that records a chunk's
// boundaries before its first upload is always fsynced (except under
// FsyncNever), so a re-put after any crash sends the same key and bytes.
//
// # Recovery
//
// Start looks for logs left in Dir by a previous process. For each one it
// reads the state file, scans the WAL and repairs it: a torn or corrupt tail
// (the last record, cut by a crash mid-write) is truncated; damage followed
// by valid records (possible only after a power loss or disk fault) makes it
// rewrite the WAL without the damaged bytes, so a valid record is never
// dropped. Records are valid when their CRC matches and their seq is greater
// than the previous record's. Then the flusher re-puts the chunk recorded as
// in flight, if any, with exactly the same lines, and flushes the rest. A
// log that was not closed is treated as closed with final=false (the job is
// redelivered and a later attempt assembles the transcript); a log that was
// closed final is assembled once flushed. Recovered logs count for
// WaitPersisted and Backlog like any other.
//
// # Retries
//
// Every storage call (and AssembleFunc) is bounded by Config.AttemptTimeout
// and retried after a failure with exponential backoff from Config.RetryMin
// to Config.RetryMax, each wait drawn uniformly from [d/2, d]. Errors wrapping
// storage.ErrInvalidKey or storage.ErrTooLarge are permanent: the log's
// flusher gives up, logs at error level and keeps the files, which Stop and
// WaitPersisted report (ErrNotPersisted) and the next Start retries.
// Retried failures are logged through a rate limiter (a few per 5s, with a
// count of the suppressed ones). Stop cuts the backoff in progress short so
// a last attempt happens at once, then keeps retrying until its ctx ends;
// what is still not persisted is listed in its error and recovered by the
// next Start. Line contents are never logged.
//
// # Full disk
//
// Start writes Config.ReserveBytes (1 MiB) into <Dir>/.reserve. When a WAL
// write finds the disk full (ENOSPC, EDQUOT), Append records nothing and
// returns an error wrapping ErrNoSpace, the journal deletes the reserve (so
// the flusher can still write the state file that records a chunk, upload,
// and remove persisted logs, which frees their space) and Full reports the
// reason until a prober (every Config.SpaceProbeInterval) finds room for
// the reserve and as much again (statfs, no write) and writes the reserve
// back. The worker stops pulling while the journal is full and still
// publishes the lines it cannot journal; the archiver stores them in the
// transcript from the stream. A final log with no line at all (everything
// came while the disk was full) is not assembled by the journal. Config.Test.
// WriteFault is the fault-injection seam for these paths.
//
// # On-disk format
//
// <Dir>/.lock is flocked by the running Journal (Start to Stop), so two
// processes never recover the same logs; the kernel releases it when the
// process dies. Each query attempt has two files in <Dir>/<tenant>/<id>/:
//
//	<attempt>.wal    records, back to back, no file header:
//	                 [uint32 length][uint64 seq][uint32 crc32c][length bytes of line]
//	                 little-endian; the CRC (Castagnoli) covers length, seq and line
//	<attempt>.state  JSON: {"v":1,"tenant","id","attempt","flushed_seq",
//	                 "pending":{"first","last"},"closed","final"}
//
// flushed_seq is the last seq known to be in storage and pending the chunk
// being put. The WAL is removed before the state file once a log is
// persisted; files ending in ".tmp" are leftovers of interrupted atomic
// writes and are deleted by Start.
package journal
