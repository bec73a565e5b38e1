package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// reserveFile holds Config.ReserveBytes of the journal's disk, written at
// Start and deleted the moment the disk is found full, so the flusher can
// still write what it needs to make progress (the state file that records a
// chunk before its upload, temporary files) and free the space of persisted
// logs.
const reserveFile = ".reserve"

// ErrNoSpace is wrapped by Append when the journal's disk is full (ENOSPC or
// EDQUOT). Nothing is recorded; the caller may keep the line elsewhere (the
// worker still publishes it to NATS, and the archiver stores it from there).
var ErrNoSpace = errors.New("journal: no space left on the journal's disk")

// space tracks whether the journal's disk can take lines: the reserve
// file, the full flag and the prober that clears it.
type space struct {
	cfg    *Config
	logger *zerolog.Logger

	mu        sync.Mutex
	full      error         // why the disk is full; nil when it is not
	recovered chan struct{} // closed when full ends
	wake      chan struct{} // capacity 1: the prober looks at once
}

func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Full reports why the journal cannot take lines now (nil when it can), and
// a channel closed once it can again.
//
//lint:ignore ST1008 the reason is Full's answer, not a failure of the call.
func (j *Journal) Full() (reason error, recovered <-chan struct{}) {
	j.space.mu.Lock()
	defer j.space.mu.Unlock()
	return j.space.full, j.space.recovered
}

// startFull records that Start found no room for the reserve: the journal
// refuses lines until the prober finds room.
func (s *space) startFull(err error) {
	if !noSpace(err) {
		s.logger.Warn().Err(err).Msg("journal: writing the space reserve")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.full = fmt.Errorf("journal disk full (%s): %w", s.cfg.Dir, err)
	s.recovered = make(chan struct{})
}

// markFull records that a write found the disk full: it releases the
// reserve, so flushers can make progress, and logs once.
func (s *space) markFull(cause error) {
	s.mu.Lock()
	if s.full != nil {
		s.mu.Unlock()
		return
	}
	s.full = fmt.Errorf("journal disk full (%s): %w", s.cfg.Dir, cause)
	s.recovered = make(chan struct{})
	s.mu.Unlock()
	released := os.Remove(filepath.Join(s.cfg.Dir, reserveFile)) == nil
	s.logger.Error().Err(cause).Bool("reserve_released", released).
		Msg("journal disk full: lines are not journaled until space returns (they still go to NATS)")
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// writeReserve writes the reserve file with real blocks (a sparse file
// reserves nothing). It fails, leaving no partial file, when they do not fit.
func (s *space) writeReserve() error {
	if s.cfg.ReserveBytes <= 0 {
		return nil
	}
	if fault := s.cfg.Test.WriteFault; fault != nil {
		if err := fault("reserve"); err != nil {
			return err
		}
	}
	path := filepath.Join(s.cfg.Dir, reserveFile)
	if st, err := os.Stat(path); err == nil && st.Size() >= int64(s.cfg.ReserveBytes) {
		return nil
	}
	f, err := os.OpenFile(path+tmpSuffix, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for left := s.cfg.ReserveBytes; left > 0 && err == nil; left -= len(buf) {
		_, err = f.Write(buf[:min(left, len(buf))])
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(path+tmpSuffix, path)
	}
	if err != nil {
		_ = os.Remove(path + tmpSuffix)
	}
	return err
}

// spaceLoop watches a full disk: every SpaceProbeInterval (or at once when
// marked full) it tries to write the reserve again; once that works, the
// disk has room for the reserve and more, and the journal takes lines again.
func (s *space) loop(stop <-chan struct{}) {
	t := time.NewTicker(s.cfg.SpaceProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.wake:
		case <-stop:
			return
		}
		s.mu.Lock()
		full := s.full
		s.mu.Unlock()
		if full == nil {
			continue
		}
		if err := s.probe(); err != nil {
			continue
		}
		s.mu.Lock()
		s.full = nil
		close(s.recovered)
		s.mu.Unlock()
		s.logger.Info().Msg("journal disk has room again: journaling lines")
	}
}

// probeSpace checks that the disk has room for the reserve and as much
// again for lines (without writing: a probe that wrote would take the room
// the flusher needs), then writes the reserve back.
func (s *space) probe() error {
	if fault := s.cfg.Test.WriteFault; fault != nil {
		if err := fault("probe"); err != nil {
			return err
		}
	}
	want := int64(2 * max(s.cfg.ReserveBytes, 64<<10))
	free, err := freeBytes(s.cfg.Dir)
	switch {
	case err == nil && free < want:
		return fmt.Errorf("%d bytes free, want %d: %w", free, want, syscall.ENOSPC)
	case err != nil && !errors.Is(err, errors.ErrUnsupported):
		return err
	}
	return s.writeReserve()
}
