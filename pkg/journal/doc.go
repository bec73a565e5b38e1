// Package journal is the worker's local, ordered log of the lines an agent
// writes to stdout that are not durable elsewhere yet. Each line is appended
// to the journal before it is published to NATS. It runs in one of two
// modes:
//
//   - Memory first (Config.SpillAfter > 0, what the worker runs): a line is
//     durable once FLEET_QUERIES acknowledged it, so the journal holds a line
//     in memory only until Log.Ack says the stream has it, and writes
//     nothing on the happy path (no file, no fsync, no storage call per
//     job). Lines the stream has not acknowledged SpillAfter after they
//     were appended (NATS away or slow), more than SpillBytes of them, a
//     line too large for NATS (AppendWhole), or lines still unacknowledged when the log is
//     closed or the journal stops, are spilled: the log creates its WAL on
//     disk, writes them there, and from then on works as below, except that
//     it skips, when flushing, the lines the stream acknowledged meanwhile.
//     So only lines that never reached the stream are put to storage; the
//     archiver (internal/archiver) writes transcripts from the stream and
//     merges those chunks in. See # Memory first.
//   - Disk first (SpillAfter 0): every line is written to the WAL at Append,
//     and a flusher copies the WAL to storage in order, retrying with
//     backoff, and assembles the transcript from the chunks.
//
// A storage outage only delays persistence (the backlog grows on local
// disk, not in memory: a flusher holds at most one chunk, and a closed log
// waiting for storage keeps no file open); it never loses or reorders a
// line and never blocks the agent's output. A worker that restarts after a
// crash flushes what it had on disk before dying.
//
// Usage (the worker):
//
//	j, err := journal.New(journal.Config{Dir: dir, Store: store, SpillAfter: time.Second, AssembleFunc: merge})
//	err = j.Start(ctx)              // recovers logs left by a crashed process
//	l, err := j.Open(tenant, id, attempt)
//	err = l.Append(seq, line)       // for every stdout line, before publishing it
//	l.Ack(seq)                      // once the stream stored every line up to seq
//	err = l.Close(final)            // final=true when the query ended here
//	err = j.Stop(ctx)               // spills what is not acked, last flush, bounded by ctx
//
// # Memory first
//
// What a crash can lose: a line is in the stream (durable), or in the
// journal's memory for at most SpillAfter (or until SpillBytes), or on
// disk. A SIGKILL of the worker loses the lines held in memory, which never
// reached the stream and so were never seen by a subscriber; the agent
// that wrote them dies with the worker, and the job's next attempt
// continues after the last line the stream holds. Lines on disk are
// recovered by the next Start as under disk first, then put to storage as
// chunks, which the archiver merges into the transcript.
//
// Full disk: Append never waits for the disk; a spill that finds the disk
// full writes nothing (all or nothing: a partial WAL is removed), marks
// the journal full (Full, so the worker stops pulling and says why) and
// keeps the lines in memory, where an Ack still drops them; the spill is
// retried every SpillAfter/4 and succeeds once the disk has room. No line
// is dropped. A line appended with AppendWhole (the worker's lines over the
// NATS max payload) spills its log at once, because it reaches the stream
// as a pointer and must reach storage whole (storage.LineKey); a spilled
// log never skips such a line. (Append never calls LargeLineBytesFunc,
// which may wait for a reconnecting NATS connection.) Memory is bounded by the worker's relay, which holds the same
// unacknowledged lines (QueueBytes, queued or in flight, kept below
// SpillBytes) and makes the agent wait beyond it: an agent writing faster
// than a healthy stream stores is paced, not spilled.
//
// Backlog counts spilled lines not yet in storage; lines held in memory
// are not counted.
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
// calls Config.AssembleFunc (disk first: storage.AssembleTranscript, which
// concatenates the chunks into the transcript; the worker, memory first,
// passes the archiver's merge of its chunks into the transcript written
// from the stream). A memory-first log that put nothing calls no hook.
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
// (Disk first, or a spilled log.)
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
