package storage

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Newer reports whether status event a should replace b as a query's
// status record. The rule, in order:
//
//  0. When both carry a JobSeq (the FLEET_JOBS sequence of the submission),
//     the later submission wins: an id submitted again after an earlier run
//     ended starts a new run, whose events supersede the old run's.
//  1. The higher Attempt wins: a new attempt supersedes everything an older
//     attempt said, and a late event of an older attempt changes nothing.
//  2. Within one attempt, a terminal state (succeeded, failed, cancelled)
//     replaces any non-terminal one and is never replaced by one. Of two
//     terminal events of one attempt, the earlier At wins: the first outcome
//     stands (on equal At, b stays).
//  3. Between two non-terminal events of one attempt (queued, retrying,
//     running, in any order: a worker may report retrying after running when
//     its sandbox fails), the later At wins; on equal At, a wins.
//
// So an older event can never overwrite a newer terminal one, and the record
// a query ends with does not depend on the order its events arrive in.
func Newer(a, b protocol.StatusEvent) bool {
	if a.JobSeq != 0 && b.JobSeq != 0 && a.JobSeq != b.JobSeq {
		return a.JobSeq > b.JobSeq
	}
	if a.Attempt != b.Attempt {
		return a.Attempt > b.Attempt
	}
	switch at, bt := a.State.Terminal(), b.State.Terminal(); {
	case at && bt:
		return a.At.Before(b.At)
	case at != bt:
		return at
	}
	return !a.At.Before(b.At)
}

// statusLocks serialise PutStatus per key within this process, so that
// concurrent events of one query cannot interleave their read-compare-write.
// Keys are spread over a fixed set of mutexes (no per-query state to leak).
var statusLocks [64]sync.Mutex

func statusLock(key string) *sync.Mutex { return &statusLocks[statusLockIndex(key)] }

func statusLockIndex(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(statusLocks)))
}

// PutStatus stores ev as its query's status record (StatusKey), unless the
// stored record is newer by the rule of Newer, in which case it does nothing
// and returns nil. ev's tenant and id must be valid (protocol.ValidTenant,
// protocol.ValidID), else the error wraps ErrInvalidKey.
//
// The first record of a query is written with Create when the store is a
// Creator. Later writes are read-compare-write: serialised within this
// process, but not atomic across processes, so one process (the dispatcher,
// which keeps the status index) should write status records. A record that
// cannot be decoded is replaced.
func PutStatus(ctx context.Context, s Store, ev protocol.StatusEvent) error {
	key, err := statusKey(ev.Tenant, ev.ID)
	if err != nil {
		return err
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("storage: put status %s/%s: encode: %w", ev.Tenant, ev.ID, err)
	}
	mu := statusLock(key)
	mu.Lock()
	defer mu.Unlock()

	if c, ok := s.(Creator); ok {
		err := c.Create(ctx, key, b)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrExists) {
			return fmt.Errorf("storage: put status %s/%s: %w", ev.Tenant, ev.ID, err)
		}
	}
	raw, err := s.Get(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return fmt.Errorf("storage: put status %s/%s: read current: %w", ev.Tenant, ev.ID, err)
	default:
		var cur protocol.StatusEvent
		if json.Unmarshal(raw, &cur) == nil && !Newer(ev, cur) {
			return nil
		}
	}
	if err := s.Put(ctx, key, b); err != nil {
		return fmt.Errorf("storage: put status %s/%s: %w", ev.Tenant, ev.ID, err)
	}
	return nil
}

// GetStatus returns a query's status record, or an error wrapping
// ErrNotFound.
func GetStatus(ctx context.Context, s Store, tenant, id string) (*protocol.StatusEvent, error) {
	key, err := statusKey(tenant, id)
	if err != nil {
		return nil, err
	}
	raw, err := s.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("storage: get status %s/%s: %w", tenant, id, err)
	}
	var ev protocol.StatusEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, fmt.Errorf("storage: get status %s/%s: decode: %w", tenant, id, err)
	}
	return &ev, nil
}

// listConcurrency bounds the parallel reads of ListStatus.
const listConcurrency = 8

// ListStatus returns the status records of tenant ("" = every tenant),
// newest At first (ties by tenant, then id), at most limit of them (limit
// <= 0 = all). It reads every record under the prefix, eight at a time.
// Records that vanish between List and Get, or cannot be decoded, are
// skipped, so one damaged record cannot break the listing.
func ListStatus(ctx context.Context, s Store, tenant string, limit int) ([]protocol.StatusEvent, error) {
	if tenant != "" && !protocol.ValidTenant(tenant) {
		return nil, fmt.Errorf("storage: list status: tenant %q: %w", tenant, ErrInvalidKey)
	}
	keys, err := s.List(ctx, StatusPrefix(tenant))
	if err != nil {
		return nil, fmt.Errorf("storage: list status of %q: %w", tenant, err)
	}
	events := make([]*protocol.StatusEvent, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, listConcurrency)
	var wg sync.WaitGroup
	for i, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			raw, err := s.Get(ctx, key)
			if err != nil {
				if !errors.Is(err, ErrNotFound) {
					errs[i] = err
				}
				return
			}
			var ev protocol.StatusEvent
			if json.Unmarshal(raw, &ev) == nil {
				events[i] = &ev
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("storage: list status of %q: %w", tenant, err)
	}
	out := make([]protocol.StatusEvent, 0, len(keys))
	for _, ev := range events {
		if ev != nil {
			out = append(out, *ev)
		}
	}
	slices.SortStableFunc(out, func(a, b protocol.StatusEvent) int {
		return cmp.Or(b.At.Compare(a.At), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.ID, b.ID))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func statusKey(tenant, id string) (string, error) {
	if !protocol.ValidTenant(tenant) || !protocol.ValidID(id) {
		return "", fmt.Errorf("storage: status of %q/%q: tenant must match %s and id %s: %w",
			tenant, id, protocol.TenantPattern, protocol.IDPattern, ErrInvalidKey)
	}
	return StatusKey(tenant, id), nil
}
