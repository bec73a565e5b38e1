package journal

import (
	"bytes"
	"errors"
	"os"
	"time"
)

// Memory first (Config.SpillAfter > 0): a log keeps its lines in memory
// (mem) until Ack says the stream has them; it spills to disk (creates its
// WAL, writes the lines held, and from then on works like a disk-first log)
// only when lines stay unacked SpillAfter, pass SpillBytes, a line is large
// (AppendWhole: it must reach storage whole, storage.LineKey), or the log is closed or
// the journal stopped with lines not acked. A spilled log skips, when it
// flushes, the lines the stream acknowledged meanwhile: only what never
// reached the stream is put to storage.

// memLine is a line held in memory.
type memLine struct {
	seq   uint64
	line  []byte
	at    time.Time
	whole bool // AppendWhole
}

// record is a spilled WAL record not yet flushed nor skipped.
type record struct {
	seq        uint64
	start, end int64
	large      bool
}

// hold keeps a line in memory (l.mu held) and spills when it must.
// (It never calls LargeLineBytesFunc: the worker's asks the NATS
// connection, whose lock a reconnect holds; AppendWhole says it instead.)
func (l *Log) hold(seq uint64, line []byte, whole, owned bool) {
	if !owned {
		line = bytes.Clone(line)
	}
	l.mem = append(l.mem, memLine{seq: seq, line: line, at: l.j.cfg.Test.NowFunc(), whole: whole})
	l.memBytes += int64(len(line)) + 1
	l.lastSeq = seq
	if l.memBytes > int64(l.j.cfg.SpillBytes) || whole {
		_ = l.spill() // on a full disk the lines stay in memory; retried
	}
}

// Ack says every line up to seq is stored in the stream: a memory-first
// log forgets them (or, once spilled, does not put them to storage). It
// does nothing on a disk-first log.
func (l *Log) Ack(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.memory || seq <= l.acked {
		return
	}
	l.acked = seq
	if !l.lazy {
		return
	}
	i := 0
	for i < len(l.mem) && l.mem[i].seq <= seq {
		l.memBytes -= int64(len(l.mem[i].line)) + 1
		i++
	}
	clear(l.mem[:i])
	l.mem = l.mem[i:]
}

// spill writes the lines held in memory to a new WAL and starts the
// flusher (l.mu held). All or nothing: on an error (a full disk) the WAL
// is removed and the lines stay in memory.
func (l *Log) spill() error {
	if !l.lazy {
		return nil
	}
	if err := l.create(); err != nil {
		if noSpace(err) {
			l.j.space.markFull(err)
		}
		l.j.warn.spill(&l.logger, err)
		return err
	}
	last := l.lastSeq
	l.lastSeq = 0
	for _, m := range l.mem {
		if err := l.writeRecord(m.seq, m.line, m.whole); err != nil {
			l.unspill(last)
			l.j.warn.spill(&l.logger, err)
			return err
		}
	}
	l.lazy = false
	clear(l.mem)
	l.mem, l.memBytes = nil, 0
	if !l.j.startSpilledFlusher(l) {
		l.logger.Debug().Msg("journal: spilled while stopping; the next Start stores it")
	}
	return nil
}

// unspill undoes a spill that failed part way (l.mu held).
func (l *Log) unspill(last uint64) {
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	_ = os.Remove(l.walPath)
	l.j.backlogLines.Add(-l.pendingLines)
	l.j.backlogBytes.Add(-l.pendingBytes)
	l.pendingLines, l.pendingBytes, l.writeOff = 0, 0, 0
	l.records, l.oldestAt, l.dirty, l.broken = nil, time.Time{}, false, nil
	l.lastSeq = last
}

// skipAcked moves the flush point over records the stream acknowledged
// (l.mu held, no chunk in flight). Large lines are not skipped: they must
// reach storage whole.
func (l *Log) skipAcked() {
	if !l.memory || l.inflight != nil || l.forcedEnd > l.flushedOff {
		return
	}
	for len(l.records) > 0 {
		r := l.records[0]
		if r.seq > l.acked || r.large || r.start != l.flushedOff {
			break
		}
		n := r.end - r.start - headerSize + 1
		l.flushedOff, l.flushedSeq = r.end, r.seq
		l.pendingLines--
		l.pendingBytes -= n
		l.j.backlogLines.Add(-1)
		l.j.backlogBytes.Add(-n)
		l.records = l.records[1:]
	}
	if l.flushedOff >= l.writeOff {
		l.oldestAt = time.Time{}
	}
}

// flushed drops the records a chunk put (l.mu held).
func (l *Log) dropFlushedRecords() {
	i := 0
	for i < len(l.records) && l.records[i].end <= l.flushedOff {
		i++
	}
	l.records = l.records[i:]
}

// dropInMemory ends a closed log that never spilled and holds nothing.
func (l *Log) dropInMemory() {
	l.mu.Lock()
	l.persisted, l.done = true, true
	l.mu.Unlock()
	close(l.finished)
	l.j.mu.Lock()
	delete(l.j.logs, l.key)
	l.j.mu.Unlock()
}

// spillIfDue spills a memory-first log whose oldest line waited SpillAfter
// for its ack, or that was closed (or the journal is stopping) with lines
// held; a closed log that spills is then closed like a disk-first one.
func (l *Log) spillIfDue(now time.Time, force bool) {
	l.mu.Lock()
	if !l.lazy {
		l.mu.Unlock()
		return
	}
	if len(l.mem) == 0 {
		closed := l.closed
		l.mu.Unlock()
		if closed && !l.isPersisted() {
			l.dropInMemory()
		}
		return
	}
	if !force && !l.closed && now.Sub(l.mem[0].at) < l.j.cfg.SpillAfter {
		l.mu.Unlock()
		return
	}
	if err := l.spill(); err != nil || !l.closed {
		l.mu.Unlock()
		return
	}
	f := l.f
	l.f, l.dirty = nil, false
	l.mu.Unlock()
	var err error
	if f != nil {
		err = f.Close()
	}
	err = errors.Join(err, l.writeState(l.j.cfg.Fsync == FsyncAlways))
	l.signal()
	if err != nil {
		l.logger.Error().Err(err).Msg("journal: closing a spilled log")
	}
}

// startSpilledFlusher starts the flusher of a log that just spilled,
// unless Stop is already waiting for the flushers.
func (j *Journal) startSpilledFlusher(l *Log) bool {
	j.flusherMu.Lock()
	defer j.flusherMu.Unlock()
	if j.noMoreFlushers {
		return false
	}
	j.flushers.Add(1)
	go func() {
		defer j.flushers.Done()
		flusher{l}.run(j.runCtx)
	}()
	return true
}

// spillLoop spills memory-first logs whose lines wait too long for their
// ack, and retries spills a full disk refused.
func (j *Journal) spillLoop() {
	defer j.background.Done()
	t := time.NewTicker(max(j.cfg.SpillAfter/4, 5*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			j.spillAll(false)
		case <-j.stopCtx.Done():
			return
		}
	}
}

// spillAll runs spillIfDue on every log (force: whatever their age).
func (j *Journal) spillAll(force bool) {
	j.mu.Lock()
	logs := make([]*Log, 0, len(j.logs))
	for _, l := range j.logs {
		if l.memory {
			logs = append(logs, l)
		}
	}
	j.mu.Unlock()
	now := j.cfg.Test.NowFunc()
	for _, l := range logs {
		l.spillIfDue(now, force)
	}
}
