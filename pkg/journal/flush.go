package journal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

type action int

const (
	actWait   action = iota // nothing to do yet
	actUpload               // put the chunk starting at from
	actFinish               // closed and fully flushed: assemble if final, remove files
	actExit                 // stopping, open and fully flushed: keep the files
)

// step is the flusher's next move, decided under l.mu.
type step struct {
	action   action
	from     int64 // first record of the chunk
	limit    int64 // read no record at or after this offset
	maxBytes int   // chunk size limit, 0 = none
	cutGaps  bool  // end the chunk before a seq gap
	wait     time.Duration
	timer    bool // wait at most wait
}

// flusher is a Log seen from its flusher goroutine: the methods that
// persist it, apart from the ones the job path calls.
type flusher struct{ *Log }

// run is the log's flusher: it persists the WAL in order, one chunk at a
// time, until the log is closed and persisted, Stop makes it exit, or it
// gives up (ctx cancelled by Stop, permanent storage error, unreadable WAL).
func (l flusher) run(ctx context.Context) {
	defer func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
		close(l.finished)
	}()
	for {
		if ctx.Err() != nil {
			if !l.idleOpen() {
				l.fail(context.Cause(ctx))
			}
			return
		}
		s := l.decide()
		switch s.action {
		case actUpload:
			if err := l.flushChunk(ctx, s); err != nil {
				l.fail(err)
				return
			}
		case actFinish:
			if err := l.finish(ctx); err != nil {
				l.fail(err)
			}
			return
		case actExit:
			return
		case actWait:
			l.wait(ctx, s)
		}
	}
}

// idleOpen reports an open log with nothing to flush: giving up on it loses
// nothing.
func (l flusher) idleOpen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed && l.flushedOff >= l.writeOff
}

func (l flusher) decide() step {
	cfg := &l.j.cfg
	stopping := l.j.stopping()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.forcedEnd > l.flushedOff {
		return step{action: actUpload, from: l.flushedOff, limit: l.forcedEnd}
	}
	l.skipAcked()
	now := cfg.Test.NowFunc()
	if l.closed || stopping {
		l.target, l.oldestAt = l.writeOff, time.Time{}
	} else if !l.oldestAt.IsZero() && !now.Before(l.oldestAt.Add(cfg.FlushInterval)) {
		l.target, l.oldestAt = l.writeOff, time.Time{}
	}
	if l.flushedOff < l.writeOff && (l.flushedOff < l.target || l.pendingBytes >= int64(cfg.ChunkBytes)) {
		return step{action: actUpload, from: l.flushedOff, limit: l.writeOff, maxBytes: cfg.ChunkBytes, cutGaps: true}
	}
	if l.flushedOff >= l.writeOff {
		if l.closed {
			return step{action: actFinish}
		}
		if stopping {
			return step{action: actExit}
		}
	}
	if l.oldestAt.IsZero() {
		return step{action: actWait}
	}
	return step{action: actWait, timer: true, wait: max(0, l.oldestAt.Add(cfg.FlushInterval).Sub(now))}
}

func (l flusher) wait(ctx context.Context, s step) {
	var timerC <-chan time.Time
	if s.timer {
		c, stop := l.j.cfg.Test.NewTimerFunc(s.wait)
		defer stop()
		timerC = c
	}
	select {
	case <-l.wake:
	case <-timerC:
	case <-l.j.stopCtx.Done():
	case <-ctx.Done():
	}
}

// chunk is one storage object's worth of consecutive lines.
type chunk struct {
	first, last uint64
	end         int64 // offset after the last record
	lines       int64
	payload     []byte    // each line followed by '\n'
	large       []lineRef // lines also stored whole under storage.LineKey
}

type lineRef struct {
	seq      uint64
	from, to int // in payload
}

// flushChunk records the next chunk in the state file, then puts its large
// lines and the chunk itself, each with retries.
func (l flusher) flushChunk(ctx context.Context, s step) error {
	cfg := &l.j.cfg
	// The flusher opens the WAL for each chunk, so a closed log waiting for
	// storage holds no file descriptor.
	f, err := os.Open(l.walPath)
	if err != nil {
		return fmt.Errorf("read WAL: %w", err)
	}
	large := cfg.LargeLineBytes
	if fn := cfg.LargeLineBytesFunc; fn != nil {
		if n := fn(); n > 0 {
			large = n
		}
	}
	c, err := readChunk(f, s.from, s.limit, s.maxBytes, s.cutGaps, large)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("read WAL %s: %w", l.walPath, err)
	}
	// Recording the chunk before its first Put makes every later Put of it
	// (retry, or recovery after a crash) use the same key and bytes.
	l.mu.Lock()
	l.inflight = &seqRange{First: c.first, Last: c.last}
	l.mu.Unlock()
	// Chunk boundaries must be durable before the chunk's first upload, so
	// a re-put after any crash sends the same key and bytes.
	sync := l.j.cfg.Fsync != FsyncNever
	if err := l.retry(ctx, "record chunk", func(context.Context) error { return l.writeState(sync) }); err != nil {
		return err
	}
	for _, ref := range c.large {
		key := storage.LineKey(l.key.tenant, l.key.id, ref.seq)
		value := c.payload[ref.from:ref.to]
		err := l.retry(ctx, "put line "+key, func(ctx context.Context) error { return cfg.Store.Put(ctx, key, value) })
		if err != nil {
			return err
		}
	}
	key := storage.ChunkKey(l.key.tenant, l.key.id, c.first, l.key.attempt)
	if err := l.retry(ctx, "put chunk "+key, func(ctx context.Context) error { return cfg.Store.Put(ctx, key, c.payload) }); err != nil {
		return err
	}
	size := int64(len(c.payload))
	l.mu.Lock()
	l.flushedOff, l.flushedSeq, l.inflight = c.end, c.last, nil
	l.uploaded = true
	l.dropFlushedRecords()
	if l.forcedEnd <= l.flushedOff {
		l.forcedEnd = 0
	}
	l.pendingLines -= c.lines
	l.pendingBytes -= size
	if l.flushedOff == l.writeOff {
		l.oldestAt = time.Time{}
	}
	l.mu.Unlock()
	l.j.backlogLines.Add(-c.lines)
	l.j.backlogBytes.Add(-size)
	l.logger.Debug().Str("key", key).Uint64("first_seq", c.first).Uint64("last_seq", c.last).
		Int("bytes", len(c.payload)).Msg("journal: chunk persisted")
	return nil
}

// readChunk reads consecutive records from r starting at from, none at or
// after limit, stopping before a record that would make the payload exceed
// maxBytes (when > 0; the first record is always taken) or, with cutGaps,
// before a seq gap. Lines longer than large (when > 0) are listed in
// chunk.large.
func readChunk(r io.ReaderAt, from, limit int64, maxBytes int, cutGaps bool, large int) (chunk, error) {
	c := chunk{end: from}
	hint := limit - from
	if maxBytes > 0 {
		hint = min(hint, int64(maxBytes))
	}
	c.payload = make([]byte, 0, hint)
	br := bufio.NewReaderSize(io.NewSectionReader(r, from, limit-from), readBufSize)
	for off := from; off < limit; {
		var hb [headerSize]byte
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			return c, fmt.Errorf("record header at offset %d: %w", off, err)
		}
		h := parseHeader(hb[:])
		if !h.plausible(off, limit, c.last) {
			return c, fmt.Errorf("corrupt record header at offset %d", off)
		}
		n := int(h.length)
		if c.lines > 0 && (cutGaps && h.seq != c.last+1 || maxBytes > 0 && len(c.payload)+n+1 > maxBytes) {
			break
		}
		start := len(c.payload)
		c.payload = slices.Grow(c.payload, n+1)[:start+n]
		if _, err := io.ReadFull(br, c.payload[start:]); err != nil {
			return c, fmt.Errorf("record at offset %d: %w", off, err)
		}
		if recordCRC(hb[:], c.payload[start:]) != h.crc {
			return c, fmt.Errorf("record at offset %d: checksum mismatch", off)
		}
		c.payload = append(c.payload, '\n')
		if c.lines == 0 {
			c.first = h.seq
		}
		c.last = h.seq
		c.lines++
		off += headerSize + int64(n)
		c.end = off
		if large > 0 && n > large {
			c.large = append(c.large, lineRef{seq: h.seq, from: start, to: start + n})
		}
	}
	if c.lines == 0 {
		return c, fmt.Errorf("no record between offsets %d and %d", from, limit)
	}
	return c, nil
}

// finish runs once a closed log is fully flushed: for a final log it waits
// for the query's earlier attempts in this journal, then assembles the
// transcript; then it removes the local files.
func (l flusher) finish(ctx context.Context) error {
	cfg := &l.j.cfg
	l.mu.Lock()
	final := l.final
	// A memory-first log that put nothing (every line reached the
	// stream) has nothing to assemble or merge.
	hooks := !l.memory || l.uploaded
	l.mu.Unlock()
	if hooks && final {
		for _, e := range l.j.earlier(l.key) {
			select {
			case <-e.finished:
			case <-ctx.Done():
				return fmt.Errorf("wait for attempt %d: %w", e.key.attempt, context.Cause(ctx))
			}
			if !e.isPersisted() {
				return fmt.Errorf("assemble: earlier attempt %d of the query is not persisted", e.key.attempt)
			}
		}
		if cfg.AssembleFunc != nil {
			l.mu.Lock()
			empty := l.writeOff == 0
			l.mu.Unlock()
			err := l.retry(ctx, "assemble transcript", func(ctx context.Context) error {
				err := cfg.AssembleFunc(ctx, l.key.tenant, l.key.id)
				if empty && errors.Is(err, storage.ErrNotFound) {
					// Nothing was journaled (the disk was full): there is
					// nothing to assemble here; the lines are in the stream.
					return nil
				}
				return err
			})
			if err != nil {
				return err
			}
		}
	} else if hooks && cfg.NonFinalFunc != nil {
		err := l.retry(ctx, "non-final hook", func(ctx context.Context) error {
			return cfg.NonFinalFunc(ctx, l.key.tenant, l.key.id)
		})
		if err != nil {
			return err
		}
	}
	if err := l.removeFiles(); err != nil {
		// Everything is in storage; the next Start re-puts the last chunk
		// (same key and bytes) and removes the files.
		l.logger.Error().Err(err).Msg("journal: remove persisted log files")
	}
	l.mu.Lock()
	l.persisted = true
	l.mu.Unlock()
	l.j.forget(l.Log)
	l.logger.Debug().Bool("final", final).Msg("journal: log persisted")
	return nil
}

func (l flusher) fail(err error) {
	l.mu.Lock()
	l.failErr = err
	lines := l.pendingLines
	l.mu.Unlock()
	l.logger.Error().Err(err).Int64("pending_lines", lines).
		Msg("journal: flusher gave up; local files kept for recovery on next start")
}

// retry calls fn until it succeeds, with a per-call timeout and exponential
// backoff with jitter. It returns early on a permanent error or when ctx
// (the journal's run context) ends. Once Stop is called, the backoff in
// progress is cut short so a last attempt happens at once.
func (l flusher) retry(ctx context.Context, op string, fn func(context.Context) error) error {
	cfg := &l.j.cfg
	for n := 0; ; n++ {
		stoppingBefore := l.j.stopping()
		actx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %w)", op, context.Cause(ctx), err)
		}
		if permanent(err) {
			return fmt.Errorf("%s: permanent error: %w", op, err)
		}
		d := backoff(cfg.RetryMin, cfg.RetryMax, n)
		l.j.warn.storage(&l.logger, op, n+1, d, err)
		if !stoppingBefore && l.j.stopping() {
			continue // Stop began during this attempt: the last attempt is due now
		}
		sctx := ctx
		if !stoppingBefore {
			sctx = l.j.stopCtx // Stop cuts this backoff short
		}
		if serr := cfg.Test.SleepFunc(sctx, d); serr != nil && ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %w)", op, context.Cause(ctx), err)
		}
	}
}

// permanent reports errors that retrying cannot fix.
func permanent(err error) bool {
	return errors.Is(err, storage.ErrInvalidKey) || errors.Is(err, storage.ErrTooLarge)
}

// backoff returns the wait before retry n+1: RetryMin doubled n times, capped
// at RetryMax, then drawn uniformly from [d/2, d].
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	return half + rand.N(d-half+1)
}
