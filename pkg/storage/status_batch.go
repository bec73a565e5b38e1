package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// PutStatuses stores many status events in one batch (PutBatch: on FS,
// one filesystem sync for all of them instead of an fsync per record):
// for each query the newest of evs by the rule of Newer, written only when
// it is newer than the stored record, like PutStatus. Events of one query
// may appear more than once. The error names the events that could not be
// stored; on error every event may be given again.
func PutStatuses(ctx context.Context, s Store, evs []protocol.StatusEvent) error {
	newest := map[string]protocol.StatusEvent{}
	for _, ev := range evs {
		key, err := statusKey(ev.Tenant, ev.ID)
		if err != nil {
			return err
		}
		if cur, ok := newest[key]; !ok || Newer(ev, cur) {
			newest[key] = ev
		}
	}
	keys := make([]string, 0, len(newest))
	for k := range newest {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	// The per-key locks of PutStatus, taken in index order (no deadlock
	// with another batch; PutStatus holds one at a time).
	var idx []int
	for _, k := range keys {
		i := statusLockIndex(k)
		if !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	for _, i := range idx {
		statusLocks[i].Lock()
	}
	defer func() {
		for _, i := range idx {
			statusLocks[i].Unlock()
		}
	}()
	objs := make([]Object, 0, len(keys))
	var errs []error
	for _, key := range keys {
		ev := newest[key]
		raw, err := s.Get(ctx, key)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			errs = append(errs, fmt.Errorf("storage: put status %s/%s: read current: %w", ev.Tenant, ev.ID, err))
			continue
		default:
			var cur protocol.StatusEvent
			if json.Unmarshal(raw, &cur) == nil && !Newer(ev, cur) {
				continue
			}
		}
		b, err := json.Marshal(ev)
		if err != nil {
			errs = append(errs, fmt.Errorf("storage: put status %s/%s: encode: %w", ev.Tenant, ev.ID, err))
			continue
		}
		objs = append(objs, Object{Key: key, Value: b})
	}
	if err := PutBatch(ctx, s, objs); err != nil {
		errs = append(errs, fmt.Errorf("storage: put statuses: %w", err))
	}
	return errors.Join(errs...)
}
