package journal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/agentfleet/agentfleet/pkg/startstop"
)

const (
	walSuffix   = ".wal"
	stateSuffix = ".state"
	tmpSuffix   = ".tmp"
	lockFile    = ".lock"
	maxIDBytes  = 128
	maxAttempt  = 999999 // storage.ChunkKey prints the attempt with 6 digits
)

// errStopTimeout is the cause of the run context's cancellation when Stop's
// context ends before every log is persisted.
var errStopTimeout = errors.New("journal: stop deadline reached before logs were persisted")

// logKey identifies one log: one attempt of one query.
type logKey struct {
	tenant, id string
	attempt    int
}

func (k logKey) String() string { return k.tenant + "/" + k.id + " attempt " + strconv.Itoa(k.attempt) }

// Journal is the local, durable, ordered log of every query attempt a worker
// runs, with a flusher per log that persists it to a Store. Create it with
// New, then Start, Open logs, and Stop. See the package documentation.
type Journal struct {
	cfg    Config
	logger zerolog.Logger

	// life answers Start and Stop the way every service of the fleet does.
	life startstop.Base

	warn retryLog

	backlogLines atomic.Int64
	backlogBytes atomic.Int64

	space space

	mu   sync.Mutex
	logs map[logKey]*Log

	// runCtx is the flushers' lifetime: detached from Start's ctx and
	// cancelled (with errStopTimeout) only when Stop's ctx ends first.
	runCtx    context.Context
	runCancel context.CancelCauseFunc
	// stopCtx is done once Stop is called: flushers then flush everything,
	// cut their backoff short and exit.
	stopCtx    context.Context
	stopCancel context.CancelFunc

	// flusherMu guards noMoreFlushers: set by Stop before it waits for
	// the flushers, after which a spilled log starts none.
	flusherMu      sync.Mutex
	noMoreFlushers bool

	lock       *os.File       // flock on Dir/.lock while started
	flushers   sync.WaitGroup // one goroutine per log
	background sync.WaitGroup // the fsync ticker
}

// New returns a Journal for cfg after filling in defaults and validating it,
// and creates cfg.Dir. Errors wrap ErrInvalidConfig and name the field.
func New(cfg Config) (*Journal, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal: create Dir: %w", err)
	}
	j := &Journal{
		cfg:    cfg,
		logger: cfg.Logger.With().Str("component", "journal").Logger(),
		warn:   retryLog{limit: rate.NewLimiter(rate.Every(5*time.Second), 3)},
		logs:   make(map[logKey]*Log),
		space:  space{wake: make(chan struct{}, 1)},
	}
	j.space.cfg, j.space.logger = &j.cfg, &j.logger
	return j, nil
}

// Start recovers the logs a previous process left in Dir (after a crash or
// an unfinished Stop), schedules them for flushing and starts the flusher
// and fsync goroutines. It returns once that is done. A log that was not
// closed is recovered as closed with final=false; a log closed final is
// assembled once flushed. Start takes an exclusive lock on Dir (a .lock
// file, flock on Unix) until Stop, so it fails while another process uses
// the same Dir. It answers as every service of the fleet does
// (pkg/startstop): a second Start returns ErrAlreadyStarted, Start
// after Stop (even a Stop before any Start) returns ErrStopped, and a
// Start that failed may be retried. ctx is only used for its values: the
// flushers run until Stop.
func (j *Journal) Start(ctx context.Context) error {
	err := j.life.Start(ctx, j.start)
	switch {
	case errors.Is(err, startstop.ErrStopped):
		return fmt.Errorf("%w: %w", ErrStopped, err)
	case errors.Is(err, startstop.ErrAlreadyStarted):
		return fmt.Errorf("journal: %w", err)
	}
	return err
}

func (j *Journal) start(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	lock, err := lockDir(j.cfg.Dir)
	if err != nil {
		return err
	}
	recovered, err := j.recover()
	if err != nil {
		for _, l := range recovered {
			l.closeFile()
		}
		_ = lock.Close()
		return err
	}
	j.lock = lock
	if err := j.space.writeReserve(); err != nil {
		j.space.startFull(err)
	}
	j.runCtx, j.runCancel = context.WithCancelCause(context.WithoutCancel(ctx))
	j.stopCtx, j.stopCancel = context.WithCancel(j.runCtx)
	for _, l := range recovered {
		j.logs[l.key] = l
		j.startFlusher(l)
	}
	if j.cfg.Fsync == FsyncInterval {
		j.background.Add(1)
		go j.syncLoop()
	}
	j.background.Add(1)
	go func() {
		defer j.background.Done()
		j.space.loop(j.stopCtx.Done())
	}()
	if j.cfg.SpillAfter > 0 {
		j.background.Add(1)
		go j.spillLoop()
	}
	j.logger.Info().Int("recovered_logs", len(recovered)).Str("fsync", j.cfg.Fsync.String()).Msg("journal started")
	return nil
}

// Stop stops accepting new logs and makes a last attempt, bounded by ctx, to
// persist every log (chunks, then assembly of final logs). Appends to logs
// that are still open keep working until the flushers are done; after Stop
// returns they fail with ErrStopped. Stop returns an error wrapping
// ErrNotPersisted that lists every log not fully persisted; their files stay
// in Dir and the next Start recovers them. A Stop before Start only marks
// the journal stopped; a second Stop returns the first one's result.
func (j *Journal) Stop(ctx context.Context) error {
	return j.life.Stop(ctx, j.stop)
}

func (j *Journal) stop(ctx context.Context) error {
	// Shutdown order, senders before receivers: (1) no new logs (stopped
	// flag) and flushers switch to "flush everything, then exit"; (2) wait
	// for the flushers, cancelling their storage calls if ctx ends first;
	// (3) stop the fsync ticker; (4) fsync and close the files, after which
	// Append fails with ErrStopped.
	// Memory-first logs spill what the stream has not acknowledged, so
	// the flushers store it (or the next Start recovers it). The lifecycle
	// is already marked stopping, and spillAll takes j.mu: an Open that
	// held it before has indexed its log and started its flusher, every
	// later one sees Stopping and refuses.
	j.spillAll(true)
	j.stopCancel()
	j.flusherMu.Lock()
	j.noMoreFlushers = true
	j.flusherMu.Unlock()
	done := make(chan struct{})
	go func() {
		j.flushers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		j.runCancel(errStopTimeout)
		<-done
	}
	j.background.Wait()

	j.mu.Lock()
	logs := make([]*Log, 0, len(j.logs))
	for _, l := range j.logs {
		logs = append(logs, l)
	}
	j.mu.Unlock()
	slices.SortFunc(logs, func(a, b *Log) int { return strings.Compare(a.key.String(), b.key.String()) })
	var problems []string
	for _, l := range logs {
		if p := l.shutdown(); p != "" {
			problems = append(problems, p)
		}
	}
	j.runCancel(ErrStopped)
	_ = j.lock.Close() // releases the flock

	if len(problems) > 0 {
		err := fmt.Errorf("journal: stop: %w: %d logs kept in %s for recovery: %s",
			ErrNotPersisted, len(problems), j.cfg.Dir, strings.Join(problems, "; "))
		j.logger.Error().Err(err).Msg("journal stopped with unpersisted logs")
		return err
	}
	j.logger.Info().Msg("journal stopped")
	return nil
}

// The journal is one of the fleet's long-lived services.
var _ startstop.Service = (*Journal)(nil)

// Started is closed once Start succeeded.
func (j *Journal) Started() <-chan struct{} { return j.life.Started() }

// Stopped is closed when Stop has finished.
func (j *Journal) Stopped() <-chan struct{} { return j.life.Stopped() }

// Open creates the log of one attempt of a query and starts its flusher.
// tenant and id must be storage key segments ([A-Za-z0-9._=-], at most 128
// bytes, not "." or ".."), attempt between 0 and 999999 (ErrInvalidID
// otherwise). It returns ErrNotStarted before Start, ErrStopped after Stop and
// ErrExists when that attempt's log is already open or being recovered.
func (j *Journal) Open(tenant, id string, attempt int) (*Log, error) {
	key := logKey{tenant: tenant, id: id, attempt: attempt}
	if err := validKey(key); err != nil {
		return nil, fmt.Errorf("journal: open %s: %w", key, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.life.Stopping():
		return nil, fmt.Errorf("journal: open %s: %w", key, ErrStopped)
	case !j.life.Running():
		return nil, fmt.Errorf("journal: open %s: %w", key, ErrNotStarted)
	case j.logs[key] != nil:
		return nil, fmt.Errorf("journal: open %s: %w", key, ErrExists)
	}
	l := j.newLog(key)
	if j.cfg.SpillAfter > 0 {
		// Memory first: no file, no flusher until the log spills.
		l.memory, l.lazy = true, true
		j.logs[key] = l
		return l, nil
	}
	if err := l.create(); err != nil {
		return nil, fmt.Errorf("journal: open %s: %w", key, err)
	}
	j.logs[key] = l
	j.startFlusher(l)
	return l, nil
}

// WaitPersisted waits until every closed log of the query (including
// recovered ones) is persisted: all chunks in storage, and the transcript
// assembled for a final log. It returns nil at once when there are none, an
// error wrapping ErrNotPersisted when a log gave up (a permanent storage
// error, or Stop), and ctx's error when ctx ends first. Logs that are still
// open are not waited for.
func (j *Journal) WaitPersisted(ctx context.Context, tenant, id string) error {
	for {
		var waitOn *Log
		var errs []error
		j.mu.Lock()
		for k, l := range j.logs {
			if k.tenant != tenant || k.id != id {
				continue
			}
			closed, finished, err := l.status()
			switch {
			case finished && err != nil:
				errs = append(errs, err)
			case closed && !finished && waitOn == nil:
				waitOn = l
			}
		}
		j.mu.Unlock()
		if waitOn == nil {
			return errors.Join(errs...)
		}
		select {
		case <-waitOn.finished:
		case <-ctx.Done():
			return fmt.Errorf("journal: wait for %s/%s to be persisted: %w", tenant, id, ctx.Err())
		}
	}
}

// Backlog returns the number of lines, and their bytes (each line plus its
// newline), appended but not yet in storage, over all logs.
func (j *Journal) Backlog() (lines, bytes int64) {
	return j.backlogLines.Load(), j.backlogBytes.Load()
}

func (j *Journal) startFlusher(l *Log) {
	j.flushers.Add(1)
	go func() {
		defer j.flushers.Done()
		flusher{l}.run(j.runCtx)
	}()
}

// forget drops a persisted log from the index and removes its query's
// directories when they are empty.
func (j *Journal) forget(l *Log) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.logs, l.key)
	// Remove fails (harmlessly) while another attempt's files are there.
	_ = os.Remove(filepath.Join(j.cfg.Dir, l.key.tenant, l.key.id))
	_ = os.Remove(filepath.Join(j.cfg.Dir, l.key.tenant))
}

// earlier returns the logs of the same query with a lower attempt.
func (j *Journal) earlier(key logKey) []*Log {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*Log
	for k, l := range j.logs {
		if k.tenant == key.tenant && k.id == key.id && k.attempt < key.attempt {
			out = append(out, l)
		}
	}
	return out
}

func (j *Journal) stopping() bool { return j.stopCtx.Err() != nil }

// syncLoop is the group commit of FsyncInterval.
func (j *Journal) syncLoop() {
	defer j.background.Done()
	t := time.NewTicker(j.cfg.FsyncInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			j.mu.Lock()
			logs := make([]*Log, 0, len(j.logs))
			for _, l := range j.logs {
				logs = append(logs, l)
			}
			j.mu.Unlock()
			for _, l := range logs {
				l.syncIfDirty()
			}
		case <-j.stopCtx.Done():
			return
		}
	}
}

// retryLog limits the "persist failed, will retry" and "spill failed"
// logs; suppressed counts the ones it dropped since the last one written.
type retryLog struct {
	limit      *rate.Limiter
	suppressed atomic.Int64
}

// storage logs a failed storage call through the rate limiter.
func (r *retryLog) storage(logger *zerolog.Logger, op string, retry int, backoff time.Duration, err error) {
	if !r.limit.Allow() {
		r.suppressed.Add(1)
		return
	}
	logger.Warn().Err(err).Str("op", op).Int("retry", retry).Dur("backoff", backoff).
		Int64("suppressed", r.suppressed.Swap(0)).Msg("journal: persist failed, will retry")
}

// spill logs a failed spill through the rate limiter.
func (r *retryLog) spill(logger *zerolog.Logger, err error) {
	if !r.limit.Allow() {
		r.suppressed.Add(1)
		return
	}
	logger.Warn().Err(err).Int64("suppressed", r.suppressed.Swap(0)).
		Msg("journal: spilling lines the stream has not acknowledged failed; they stay in memory, will retry")
}

func validKey(k logKey) error {
	for _, f := range []struct{ name, v string }{{"tenant", k.tenant}, {"id", k.id}} {
		if err := validSegment(f.v); err != nil {
			return fmt.Errorf("%w: %s %w", ErrInvalidID, f.name, err)
		}
	}
	if k.attempt < 0 || k.attempt > maxAttempt {
		return fmt.Errorf("%w: attempt must be between 0 and %d", ErrInvalidID, maxAttempt)
	}
	return nil
}

var errBadSegment = errors.New("must be 1-128 bytes of [A-Za-z0-9._=-], not \".\" or \"..\"")

func validSegment(s string) error {
	if s == "" || len(s) > maxIDBytes || s == "." || s == ".." {
		return errBadSegment
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '=' || c == '-'
		if !ok {
			return errBadSegment
		}
	}
	return nil
}
