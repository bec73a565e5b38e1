package journal

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// recover loads every log left in Dir. Called by Start with j.mu held.
func (j *Journal) recover() ([]*Log, error) {
	var out []*Log
	tenants, err := os.ReadDir(j.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("journal: recover: %w", err)
	}
	for _, t := range tenants {
		if t.Name() == lockFile || strings.HasPrefix(t.Name(), reserveFile) {
			continue
		}
		if !t.IsDir() || validSegment(t.Name()) != nil {
			j.logger.Warn().Str("name", t.Name()).Msg("journal: recover: ignoring unexpected entry")
			continue
		}
		tdir := filepath.Join(j.cfg.Dir, t.Name())
		ids, err := os.ReadDir(tdir)
		if err != nil {
			return out, fmt.Errorf("journal: recover: %w", err)
		}
		for _, q := range ids {
			if !q.IsDir() || validSegment(q.Name()) != nil {
				j.logger.Warn().Str("name", filepath.Join(t.Name(), q.Name())).Msg("journal: recover: ignoring unexpected entry")
				continue
			}
			attempts, err := j.listAttempts(filepath.Join(tdir, q.Name()))
			if err != nil {
				return out, err
			}
			for _, a := range attempts {
				l, err := j.recoverLog(logKey{tenant: t.Name(), id: q.Name(), attempt: a})
				if err != nil {
					return out, err
				}
				out = append(out, l)
			}
			if len(attempts) == 0 {
				_ = os.Remove(filepath.Join(tdir, q.Name()))
			}
		}
		_ = os.Remove(tdir) // only succeeds when empty
	}
	return out, nil
}

// listAttempts returns the attempts that have a WAL or state file in dir,
// and removes leftover temporary files.
func (j *Journal) listAttempts(dir string) ([]int, error) {
	files, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("journal: recover: %w", err)
	}
	attempts := map[int]bool{}
	for _, f := range files {
		name := f.Name()
		if strings.HasSuffix(name, tmpSuffix) {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		base, ok := strings.CutSuffix(name, walSuffix)
		if !ok {
			base, ok = strings.CutSuffix(name, stateSuffix)
		}
		n, err := strconv.Atoi(base)
		if !ok || err != nil || n < 0 || n > maxAttempt || strconv.Itoa(n) != base || f.IsDir() {
			j.logger.Warn().Str("name", filepath.Join(dir, name)).Msg("journal: recover: ignoring unexpected entry")
			continue
		}
		attempts[n] = true
	}
	return slices.Sorted(maps.Keys(attempts)), nil
}

// recoveryScan computes a recovered log's flusher view from its records.
type recoveryScan struct {
	flushedSeq uint64
	pending    *seqRange

	flushedOff int64 // offset of the first record after flushedSeq
	lines      int64
	bytes      int64
	pendingEnd int64 // end of the recorded in-flight chunk's last record
}

func (s *recoveryScan) add(r walRecord) error {
	if r.seq <= s.flushedSeq {
		s.flushedOff = r.end()
		return nil
	}
	s.lines++
	s.bytes += int64(len(r.data)) + 1
	if s.pending != nil && r.seq >= s.pending.First && r.seq <= s.pending.Last {
		s.pendingEnd = r.end()
	}
	return nil
}

// recoverLog loads one log: its state file, then its WAL, truncating a torn
// tail or rewriting a WAL damaged in the middle so that only valid records
// remain. The log comes back closed; final only if it was closed final.
func (j *Journal) recoverLog(key logKey) (*Log, error) {
	l := j.newLog(key)
	logger := &l.logger
	st, found, err := readStateFile(l.statePath)
	if err != nil {
		if !found {
			return nil, fmt.Errorf("journal: recover %s: %w", key, err)
		}
		// Chunk boundaries are lost: re-put everything from the start.
		logger.Error().Err(err).Msg("journal: recover: unreadable state file, re-uploading the whole log")
		st = logState{}
	}
	l.closed = true
	l.final = st.Closed && st.Final
	l.flushedSeq = st.FlushedSeq
	f, err := os.OpenFile(l.walPath, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil // removal was interrupted after the WAL went; finish the job
	}
	if err != nil {
		return nil, fmt.Errorf("journal: recover %s: %w", key, err)
	}
	if !found {
		logger.Info().Msg("journal: recover: no chunk recorded yet, uploading the whole log")
	}
	l.f = f
	scan, res, err := j.repairWAL(l, st)
	if err != nil {
		l.closeFile()
		return nil, fmt.Errorf("journal: recover %s: %w", key, err)
	}
	l.closeFile() // the flusher reads through its own handle
	l.writeOff = res.validEnd
	l.lastSeq = res.lastSeq
	l.flushedOff = scan.flushedOff
	l.pendingLines = scan.lines
	l.pendingBytes = scan.bytes
	l.forcedEnd = scan.pendingEnd
	j.backlogLines.Add(scan.lines)
	j.backlogBytes.Add(scan.bytes)
	logger.Info().Int("records", res.records).Int64("pending_lines", scan.lines).Bool("final", l.final).
		Msg("journal: recovered log")
	return l, nil
}

// repairWAL scans l.f. A damaged tail (a record torn by a crash) is
// truncated; damage followed by valid records makes it rewrite the WAL
// without the damaged bytes, so no valid record is dropped.
func (j *Journal) repairWAL(l *Log, st logState) (*recoveryScan, scanResult, error) {
	newScan := func() *recoveryScan {
		s := &recoveryScan{flushedSeq: st.FlushedSeq}
		if st.Pending != nil && st.Pending.Last > st.FlushedSeq {
			s.pending = st.Pending
		}
		return s
	}
	info, err := l.f.Stat()
	if err != nil {
		return nil, scanResult{}, fmt.Errorf("stat WAL: %w", err)
	}
	scan := newScan()
	res, err := scanWAL(l.f, info.Size(), scan.add)
	if err != nil {
		return nil, res, fmt.Errorf("scan WAL: %w", err)
	}
	if len(res.corrupt) == 0 {
		return scan, res, nil
	}
	sync := j.cfg.Fsync != FsyncNever
	if res.tailOnly() {
		l.logger.Warn().Int64("offset", res.validEnd).Int64("bytes", res.corruptBytes()).
			Msg("journal: recover: truncating torn tail record")
		if err := l.f.Truncate(res.validEnd); err != nil {
			return nil, res, fmt.Errorf("truncate WAL: %w", err)
		}
		if sync {
			if err := l.f.Sync(); err != nil {
				return nil, res, fmt.Errorf("fsync WAL: %w", err)
			}
		}
		res.corrupt, res.size = nil, res.validEnd
		return scan, res, nil
	}
	l.logger.Error().Int("ranges", len(res.corrupt)).Int64("bytes", res.corruptBytes()).
		Msg("journal: recover: WAL damaged before its end; rewriting it with its valid records only")
	if err := rewriteWAL(l, res.size, sync); err != nil {
		return nil, res, err
	}
	info, err = l.f.Stat()
	if err != nil {
		return nil, res, fmt.Errorf("stat WAL: %w", err)
	}
	scan = newScan()
	res, err = scanWAL(l.f, info.Size(), scan.add)
	if err != nil {
		return nil, res, fmt.Errorf("scan WAL: %w", err)
	}
	return scan, res, nil
}

// rewriteWAL replaces l's WAL (temp file + rename) with its valid records.
func rewriteWAL(l *Log, size int64, sync bool) error {
	tmp := l.walPath + tmpSuffix
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("rewrite WAL: %w", err)
	}
	bw := bufio.NewWriterSize(out, readBufSize)
	_, err = scanWAL(l.f, size, func(r walRecord) error {
		var h [headerSize]byte
		putHeader(&h, r.seq, r.data)
		if _, err := bw.Write(h[:]); err != nil {
			return err
		}
		_, err := bw.Write(r.data)
		return err
	})
	if err == nil {
		err = bw.Flush()
	}
	if err == nil && sync {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, l.walPath)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rewrite WAL: %w", err)
	}
	if sync {
		if err := syncDir(filepath.Dir(l.walPath)); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(l.walPath, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("reopen WAL: %w", err)
	}
	_ = l.f.Close()
	l.f = f
	return nil
}
