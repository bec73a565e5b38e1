package journal

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// smallLine is the largest line Append copies into one buffer to write the
// record with a single write call; longer lines are written header first.
const smallLine = 64 << 10

// Log is the journal of one attempt of one query. Append and Close never
// wait for storage. A Log is safe for concurrent use, but appends of one
// query come from one reader of the agent's stdout, in seq order.
type Log struct {
	j         *Journal
	key       logKey
	walPath   string
	statePath string
	logger    zerolog.Logger
	wake      chan struct{} // capacity 1: "look again" for the flusher
	finished  chan struct{} // closed when the flusher goroutine returns

	// stateMu serialises state file writes and the final removal; it is
	// taken before mu, never after.
	stateMu sync.Mutex
	removed bool // local files are gone; no more state writes

	mu       sync.Mutex
	f        *os.File // append handle; nil once closed (Close, Stop, recovered logs)
	scratch  []byte
	lastSeq  uint64
	writeOff int64 // end of the last complete record
	dirty    bool  // written since the last fsync
	broken   error // a failed write could not be rolled back
	closed   bool
	// Memory first (Config.SpillAfter): memory is set for the log's whole
	// life; lazy while it has no files (its lines are in mem).
	memory   bool
	lazy     bool
	mem      []memLine
	memBytes int64
	acked    uint64   // highest seq the stream acknowledged
	records  []record // spilled records from the first not flushed nor skipped
	uploaded bool     // a chunk of this log was put
	final    bool

	// Flusher view. flushedOff is the offset of the first record not yet
	// in storage; lines/bytes from there to writeOff are pending.
	flushedOff   int64
	flushedSeq   uint64
	pendingLines int64
	pendingBytes int64
	target       int64     // flush everything before this offset, whatever its size
	oldestAt     time.Time // append time of the oldest pending line not yet targeted
	inflight     *seqRange // chunk recorded in the state file, being uploaded
	forcedEnd    int64     // recovered in-flight chunk: re-put exactly [flushedOff, forcedEnd)
	done         bool      // the flusher returned
	persisted    bool      // everything in storage (and assembled if final); files removed
	failErr      error     // why the flusher gave up
}

func (j *Journal) newLog(key logKey) *Log {
	dir := filepath.Join(j.cfg.Dir, key.tenant, key.id)
	base := strconv.Itoa(key.attempt)
	return &Log{
		j:         j,
		key:       key,
		walPath:   filepath.Join(dir, base+walSuffix),
		statePath: filepath.Join(dir, base+stateSuffix),
		logger: j.logger.With().Str("tenant", key.tenant).Str("query_id", key.id).
			Int("attempt", key.attempt).Logger(),
		wake:     make(chan struct{}, 1),
		finished: make(chan struct{}),
	}
}

// create makes the log's state file and WAL. Called with j.mu held.
func (l *Log) create() error {
	dir := filepath.Dir(l.walPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}
	// The state file comes first: a WAL without a state file would be
	// recovered without its chunk boundaries.
	// A new log has no chunk boundaries yet, so it gets no state file until
	// its first chunk is recorded: recovery treats a WAL without one as a
	// log with nothing uploaded, which is exactly what it is. (One file
	// creation less per query on the job path.)
	f, err := os.OpenFile(l.walPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create WAL: %w", err)
	}
	if l.j.cfg.Fsync == FsyncAlways {
		for _, d := range []string{dir, filepath.Dir(dir), l.j.cfg.Dir} {
			if err := syncDir(d); err != nil {
				_ = f.Close()
				return err
			}
		}
	}
	l.f = f
	return nil
}

// Append writes the line with Fleet-Seq seq to the local journal: one write
// call, plus an fsync under FsyncAlways. It never waits for storage and does
// not keep line. seq must be greater than the previous one (ErrSeqOrder),
// and the first at least 1. It returns ErrInvalidLine for a line with a
// '\n' or longer than MaxLineBytes, ErrClosed after Close and ErrStopped once
// Stop closed the files. On a write error nothing is recorded and the call
// may be repeated with the same seq; on an fsync error (FsyncAlways) the line
// is recorded and will be persisted, but may not survive a power loss.
func (l *Log) Append(seq uint64, line []byte) error { return l.append(seq, line, false, false) }

// AppendOwned is Append for a line the caller hands over and never
// changes afterwards: a memory-first log holds it as it is, without a
// copy (the relay hands over the copy it publishes).
func (l *Log) AppendOwned(seq uint64, line []byte) error { return l.append(seq, line, false, true) }

// AppendWhole is Append for a line that must also reach storage whole
// (storage.LineKey): the caller sent it to the stream as a pointer because
// it is too large for NATS. A memory-first log spills at once, and never
// skips the line when the stream acknowledges its pointer.
func (l *Log) AppendWhole(seq uint64, line []byte) error { return l.append(seq, line, true, false) }

func (l *Log) append(seq uint64, line []byte, whole, owned bool) error {
	if len(line) > MaxLineBytes {
		return fmt.Errorf("journal: append %s seq %d: %w: %d bytes, limit %d", l.key, seq, ErrInvalidLine, len(line), MaxLineBytes)
	}
	if bytes.IndexByte(line, '\n') >= 0 {
		return fmt.Errorf("journal: append %s seq %d: %w: contains a newline", l.key, seq, ErrInvalidLine)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return fmt.Errorf("journal: append %s seq %d: %w", l.key, seq, ErrClosed)
	case seq <= l.lastSeq:
		return fmt.Errorf("journal: append %s seq %d: %w (last seq %d)", l.key, seq, ErrSeqOrder, l.lastSeq)
	case l.lazy:
		l.hold(seq, line, whole, owned)
		return nil
	case l.f == nil:
		return fmt.Errorf("journal: append %s seq %d: %w", l.key, seq, ErrStopped)
	case l.broken != nil:
		return fmt.Errorf("journal: append %s seq %d: log unusable after a failed write: %w", l.key, seq, l.broken)
	}
	if err := l.writeRecord(seq, line, whole); err != nil {
		return err
	}
	if l.j.cfg.Fsync == FsyncAlways {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("journal: append %s seq %d: line recorded but fsync failed: %w", l.key, seq, err)
		}
	}
	return nil
}

// writeRecord writes one record to the WAL (l.mu held, l.f open); on error
// nothing is recorded.
func (l *Log) writeRecord(seq uint64, line []byte, whole bool) error {
	cfg := &l.j.cfg
	var err error
	if fault := cfg.Test.WriteFault; fault != nil {
		if err := fault("wal"); err != nil {
			if noSpace(err) {
				l.j.space.markFull(err)
				return fmt.Errorf("journal: append %s seq %d: %w: %w", l.key, seq, ErrNoSpace, err)
			}
			return fmt.Errorf("journal: append %s seq %d: %w", l.key, seq, err)
		}
	}
	if len(line) <= smallLine {
		l.scratch = appendRecord(l.scratch[:0], seq, line)
		_, err = l.f.Write(l.scratch)
	} else {
		var h [headerSize]byte
		putHeader(&h, seq, line)
		if _, err = l.f.Write(h[:]); err == nil {
			_, err = l.f.Write(line)
		}
	}
	if err != nil {
		// Roll back a partial record so the next one starts at writeOff.
		if terr := l.f.Truncate(l.writeOff); terr != nil {
			l.broken = errors.Join(err, terr)
		}
		if noSpace(err) {
			l.j.space.markFull(err)
			return fmt.Errorf("journal: append %s seq %d: %w: %w", l.key, seq, ErrNoSpace, err)
		}
		return fmt.Errorf("journal: append %s seq %d: %w", l.key, seq, err)
	}
	n := int64(len(line)) + 1
	start := l.writeOff
	l.lastSeq = seq
	l.writeOff += headerSize + int64(len(line))
	if l.memory {
		l.records = append(l.records, record{seq: seq, start: start, end: l.writeOff, large: whole})
	}
	l.pendingLines++
	l.pendingBytes += n
	l.j.backlogLines.Add(1)
	l.j.backlogBytes.Add(n)
	wake := false
	if l.oldestAt.IsZero() {
		l.oldestAt = cfg.Test.NowFunc() // arms the flusher's FlushInterval timer
		wake = true
	}
	if l.pendingBytes >= int64(cfg.ChunkBytes) && l.pendingBytes-n < int64(cfg.ChunkBytes) {
		wake = true
	}
	if wake {
		l.signal()
	}
	if cfg.Fsync == FsyncInterval {
		l.dirty = true
	}
	return nil
}

// Close ends the log: no more appends. It fsyncs (unless FsyncNever) and
// closes the WAL, records the closed and final flags in the state file, and
// returns without waiting for storage (WaitPersisted does). With final=true
// the flusher calls Config.AssembleFunc once every chunk is persisted, then
// removes the local files; with final=false (the job was handed back or
// abandoned) it flushes the chunks and removes the files, without assembly.
// Closing twice returns ErrClosed.
func (l *Log) Close(final bool) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("journal: close %s: %w", l.key, ErrClosed)
	}
	if l.lazy {
		if len(l.mem) == 0 {
			// Every line is in the stream: nothing to keep or store.
			l.closed, l.final = true, final
			l.mu.Unlock()
			l.dropInMemory()
			return nil
		}
		// Lines the stream never acked: to disk, then stored like any
		// spilled log. On a full disk they stay in memory and the spill
		// is retried.
		if err := l.spill(); err != nil {
			l.closed, l.final = true, final
			l.mu.Unlock()
			return nil //nolint:nilerr // the lines stay in memory and the spill is retried: Close itself succeeded
		}
	}
	l.closed = true
	l.final = final
	f := l.f
	l.f, l.dirty = nil, false // the flusher reads through its own handle
	l.mu.Unlock()
	var err error
	if f != nil {
		// Under FsyncInterval the last lines are not fsynced here: the job
		// path must not wait for the disk, and the policy already allows a
		// power loss to take the last interval (the flusher persists them
		// to storage shortly after).
		if l.j.cfg.Fsync == FsyncAlways {
			if serr := f.Sync(); serr != nil {
				err = fmt.Errorf("fsync WAL: %w", serr)
			}
		}
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close WAL: %w", cerr)
		}
	}
	err = errors.Join(err, l.writeState(l.j.cfg.Fsync == FsyncAlways))
	l.signal()
	if err != nil {
		return fmt.Errorf("journal: close %s: %w", l.key, err)
	}
	return nil
}

func (l *Log) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// writeState replaces the state file with the log's current state, with
// fsyncs when sync is set.
func (l *Log) writeState(sync bool) error {
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	if l.removed {
		return nil
	}
	l.mu.Lock()
	st := logState{
		V:          stateVersion,
		Tenant:     l.key.tenant,
		ID:         l.key.id,
		Attempt:    l.key.attempt,
		FlushedSeq: l.flushedSeq,
		Pending:    l.inflight,
		Closed:     l.closed,
		Final:      l.final,
	}
	l.mu.Unlock()
	return writeStateFile(l.statePath, st, sync)
}

// removeFiles deletes the WAL, then the state file: a state file without WAL
// is harmless on recovery, a WAL without its state file would lose the
// chunk boundaries.
func (l *Log) removeFiles() error {
	l.closeFile()
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	if err := os.Remove(l.walPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove WAL: %w", err)
	}
	if err := os.Remove(l.statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove state: %w", err)
	}
	l.removed = true
	return nil
}

func (l *Log) closeFile() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}

// syncIfDirty is the FsyncInterval group commit for this log.
func (l *Log) syncIfDirty() {
	l.mu.Lock()
	if !l.dirty || l.f == nil {
		l.mu.Unlock()
		return
	}
	f := l.f
	l.dirty = false
	l.mu.Unlock()
	if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
		l.mu.Lock()
		l.dirty = true
		l.mu.Unlock()
		l.j.warn.storage(&l.logger, "fsync WAL", 0, l.j.cfg.FsyncInterval, err)
	}
}

// status reports whether the log is closed, whether its flusher returned,
// and, if it returned without persisting what it had to, why.
func (l *Log) status() (closed, finished bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done && !l.persisted && l.failErr != nil {
		err = fmt.Errorf("journal: %s: %w: %w", l.key, ErrNotPersisted, l.failErr)
	}
	return l.closed, l.done, err
}

func (l *Log) isPersisted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.persisted
}

// shutdown is Stop's last step for a log that is still indexed: fsync and
// close the WAL. It returns a description of what is not persisted, or "".
func (l *Log) shutdown() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		if l.j.cfg.Fsync != FsyncNever {
			if err := l.f.Sync(); err != nil {
				l.logger.Error().Err(err).Msg("journal: fsync WAL at stop")
			}
		}
		_ = l.f.Close()
		l.f = nil
	}
	if l.persisted {
		return ""
	}
	if l.lazy {
		if len(l.mem) == 0 {
			return ""
		}
		return fmt.Sprintf("%s: %d lines (%d bytes) the stream never acknowledged, held in memory: the disk refused them", l.key, len(l.mem), l.memBytes)
	}
	var what string
	switch {
	case l.pendingLines > 0:
		what = fmt.Sprintf("%d lines (%d bytes) not in storage", l.pendingLines, l.pendingBytes)
	case l.closed && l.final:
		what = "transcript not assembled"
	case l.closed:
		what = "local files not removed"
	case l.failErr == nil:
		return "" // open, everything flushed: the next Start just removes its files
	default:
		what = "not persisted"
	}
	if l.failErr != nil {
		what += " (" + l.failErr.Error() + ")"
	}
	return l.key.String() + ": " + what
}
