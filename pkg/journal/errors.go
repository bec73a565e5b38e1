package journal

import (
	"errors"

	"github.com/agentfleet/agentfleet/pkg/startstop"
)

// Sentinel errors. Every error the package returns wraps one of these (or a
// storage / OS error) together with the operation and the query it concerns.
var (
	// ErrInvalidConfig is wrapped by New when a Config field is out of range;
	// the message names the field.
	ErrInvalidConfig = errors.New("journal: invalid config")
	// ErrNotStarted is returned by Open before Start.
	ErrNotStarted = errors.New("journal: not started")
	// ErrStopped is returned by Start, Open and Append once Stop was called
	// (Append only after Stop closed the local files). From Start it also
	// wraps startstop.ErrStopped.
	ErrStopped = errors.New("journal: stopped")
	// ErrAlreadyStarted is returned by a second Start: the answer every
	// service of the fleet gives (startstop.ErrAlreadyStarted, named here
	// for callers outside this module).
	ErrAlreadyStarted = startstop.ErrAlreadyStarted
	// ErrExists is returned by Open when a log for the same tenant, query id
	// and attempt is already open, or is still being recovered.
	ErrExists = errors.New("journal: log already exists")
	// ErrClosed is returned by Append and Close after Close.
	ErrClosed = errors.New("journal: log closed")
	// ErrSeqOrder is returned by Append when seq is not greater than the
	// previous one (the first seq must be at least 1).
	ErrSeqOrder = errors.New("journal: seq not increasing")
	// ErrInvalidLine is returned by Append for a line that contains '\n' or
	// is longer than MaxLineBytes.
	ErrInvalidLine = errors.New("journal: invalid line")
	// ErrInvalidID is returned by Open for a tenant or id that is not a
	// storage key segment, or an attempt out of range.
	ErrInvalidID = errors.New("journal: invalid tenant, id or attempt")
	// ErrNotPersisted is wrapped by Stop and WaitPersisted when lines of a log
	// are not all in storage (or a final log was not assembled). Its local
	// files are kept and the next Start recovers them.
	ErrNotPersisted = errors.New("journal: not persisted")
)
