package journal

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Store is the narrow part of storage.Store the journal needs: every
// storage backend satisfies it. Put must honour ctx (the journal bounds each
// call with Config.AttemptTimeout and cancels calls when Stop gives up) and
// must be idempotent: the journal re-puts a chunk after a failed attempt or a
// crash, always with the same key and bytes.
type Store interface {
	Put(ctx context.Context, key string, value []byte) error
}

// FsyncPolicy says when appended lines are forced to stable storage. The
// zero value is FsyncInterval. See the package documentation (# Durability)
// for what survives a process crash and a power loss under each policy.
type FsyncPolicy int

const (
	// FsyncInterval fsyncs every log with new lines once per
	// Config.FsyncInterval, in the background (group commit). Append does
	// not wait for it.
	FsyncInterval FsyncPolicy = iota
	// FsyncAlways fsyncs inside every Append, before it returns.
	FsyncAlways
	// FsyncNever leaves write-back to the operating system.
	FsyncNever
)

// String returns "interval", "always" or "never".
func (p FsyncPolicy) String() string {
	switch p {
	case FsyncInterval:
		return "interval"
	case FsyncAlways:
		return "always"
	case FsyncNever:
		return "never"
	default:
		return fmt.Sprintf("FsyncPolicy(%d)", int(p))
	}
}

// Defaults of Config.
const (
	DefaultFsyncInterval      = 100 * time.Millisecond
	DefaultChunkBytes         = 1 << 20
	DefaultFlushInterval      = 500 * time.Millisecond
	DefaultLargeLineBytes     = 1 << 20
	DefaultRetryMin           = 100 * time.Millisecond
	DefaultRetryMax           = 30 * time.Second
	DefaultAttemptTimeout     = 30 * time.Second
	DefaultReserveBytes       = 1 << 20
	DefaultSpaceProbeInterval = time.Second
	DefaultSpillBytes         = 4 << 20
)

// MaxLineBytes is the largest line Append accepts (1 GiB).
const MaxLineBytes = 1 << 30

// Config configures a Journal. New fills in defaults and validates it.
type Config struct {
	// Dir holds the local logs, one directory per query. Required; New
	// creates it.
	Dir string
	// Store receives chunk and large-line objects. Required.
	Store Store
	// AssembleFunc builds a query's transcript from its chunk objects (the
	// worker passes storage.AssembleTranscript bound to its store). It is
	// called, retried with backoff, once every chunk of a log closed with
	// final=true is persisted. It must be idempotent. Defaults to nil: no
	// assembly.
	AssembleFunc func(ctx context.Context, tenant, id string) error
	// NonFinalFunc is called, retried like AssembleFunc, once every chunk
	// of a log that was NOT closed final is persisted (a job handed back,
	// or a log recovered after a crash). The worker uses it to re-assemble
	// a transcript that a later attempt already assembled, so the late
	// chunks of a crashed attempt join it. It must be idempotent. Defaults
	// to nil.
	NonFinalFunc func(ctx context.Context, tenant, id string) error
	// Logger receives the journal's logs. Defaults to zerolog.Nop().
	Logger *zerolog.Logger
	// Fsync is the fsync policy. Defaults to FsyncInterval.
	Fsync FsyncPolicy
	// FsyncInterval is the group-commit period of FsyncInterval. Defaults to
	// 100ms.
	FsyncInterval time.Duration
	// ChunkBytes flushes a chunk once this many bytes (lines plus their
	// newlines) are pending; it is also the largest chunk written, except
	// that a single longer line makes a chunk of its own. Keep it below the
	// backend's value-size limit. Defaults to 1 MiB.
	ChunkBytes int
	// FlushInterval flushes pending lines this long after the oldest of them
	// was appended, however few they are. Defaults to 500ms.
	FlushInterval time.Duration
	// LargeLineBytes: lines longer than this are also stored whole under
	// storage.LineKey. 0 means the default, a negative value turns it off.
	// Defaults to 1 MiB.
	LargeLineBytes int
	// LargeLineBytesFunc, if set, is asked for each chunk and, when it
	// returns more than 0, replaces LargeLineBytes: the worker passes its
	// connection's current max payload, which it learns only on its first
	// connect. Defaults to nil.
	LargeLineBytesFunc func() int
	// RetryMin is the first backoff after a failed storage call; it doubles up
	// to RetryMax, with jitter. Defaults to 100ms.
	RetryMin time.Duration
	// RetryMax caps the backoff. Defaults to 30s.
	RetryMax time.Duration
	// AttemptTimeout bounds each storage (and AssembleFunc) call. Defaults to
	// 30s.
	AttemptTimeout time.Duration
	// ReserveBytes of the journal's disk are held in a file from Start and
	// released when the disk is found full, so the flusher can still record
	// chunks and free space. 0 means the default, a negative value turns it
	// off. Defaults to 1 MiB.
	ReserveBytes int
	// SpaceProbeInterval is how often a full disk is checked for room
	// again. Defaults to 1s.
	SpaceProbeInterval time.Duration
	// SpillAfter turns on the memory-first journal (see the package
	// documentation, # Memory first): a log holds its lines in memory
	// until Log.Ack says the stream has them, and writes to disk only the
	// lines not acked this long after they were appended (NATS away or
	// slow). 0 (the default) writes every line to the WAL at Append.
	SpillAfter time.Duration
	// SpillBytes: a memory-first log also spills once the lines it holds
	// pass this many bytes. Defaults to 4 MiB.
	SpillBytes int
	// Test holds hooks for tests. Defaults to real time.
	Test TestConfig
}

// TestConfig lets tests replace time. Production code leaves it zero.
type TestConfig struct {
	// SleepFunc waits d between retries and returns early with an error when
	// ctx ends. Defaults to a timer.
	SleepFunc func(ctx context.Context, d time.Duration) error
	// NowFunc returns the time used for FlushInterval. Defaults to time.Now.
	NowFunc func() time.Time
	// NewTimerFunc starts a timer for FlushInterval waits; stop releases it.
	// Defaults to time.NewTimer.
	NewTimerFunc func(d time.Duration) (c <-chan time.Time, stop func() bool)
	// WriteFault, if set, is the fault-injection seam of the journal's own
	// disk: it is called before every WAL append ("wal"), reserve write
	// ("reserve") and space probe ("probe"), and a non-nil error is
	// treated as that write's error (e.g. syscall.ENOSPC for a full disk).
	WriteFault func(op string) error
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	c.FsyncInterval = cmp.Or(c.FsyncInterval, DefaultFsyncInterval)
	c.ChunkBytes = cmp.Or(c.ChunkBytes, DefaultChunkBytes)
	c.FlushInterval = cmp.Or(c.FlushInterval, DefaultFlushInterval)
	c.LargeLineBytes = cmp.Or(c.LargeLineBytes, DefaultLargeLineBytes)
	c.RetryMin = cmp.Or(c.RetryMin, DefaultRetryMin)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultRetryMax)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, DefaultAttemptTimeout)
	c.ReserveBytes = cmp.Or(c.ReserveBytes, DefaultReserveBytes)
	c.SpaceProbeInterval = cmp.Or(c.SpaceProbeInterval, DefaultSpaceProbeInterval)
	c.SpillBytes = cmp.Or(c.SpillBytes, DefaultSpillBytes)
	if c.Test.SleepFunc == nil {
		c.Test.SleepFunc = sleepCtx
	}
	if c.Test.NowFunc == nil {
		c.Test.NowFunc = time.Now
	}
	if c.Test.NewTimerFunc == nil {
		c.Test.NewTimerFunc = func(d time.Duration) (<-chan time.Time, func() bool) {
			t := time.NewTimer(d)
			return t.C, t.Stop
		}
	}
	return c
}

func (c Config) validate() error {
	var msg string
	switch {
	case c.Dir == "":
		msg = "Dir is required"
	case c.Store == nil:
		msg = "Store is required"
	case c.Fsync < FsyncInterval || c.Fsync > FsyncNever:
		msg = fmt.Sprintf("Fsync must be FsyncInterval, FsyncAlways or FsyncNever, got %d", int(c.Fsync))
	case c.FsyncInterval < 0:
		msg = "FsyncInterval must be positive"
	case c.ChunkBytes < 0:
		msg = "ChunkBytes must be positive"
	case c.FlushInterval < 0:
		msg = "FlushInterval must be positive"
	case c.RetryMin < 0:
		msg = "RetryMin must be positive"
	case c.RetryMax < c.RetryMin:
		msg = "RetryMax must be at least RetryMin"
	case c.AttemptTimeout < 0:
		msg = "AttemptTimeout must be positive"
	case c.SpaceProbeInterval < 0:
		msg = "SpaceProbeInterval must be positive"
	case c.SpillAfter < 0:
		msg = "SpillAfter must be positive"
	case c.SpillBytes < 0:
		msg = "SpillBytes must be positive"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, msg)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
