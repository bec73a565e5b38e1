package worker

import (
	"context"
	"time"
)

// replicasMaxAge is how long the worker trusts the replica count it read
// of FLEET_QUERIES: a dispatcher started with another --replicas updates
// the stream while workers run.
const replicasMaxAge = 30 * time.Second

// oneReplica reports whether FLEET_QUERIES is known to have a single
// replica, whose server is then its leader: the claim's reads of the last
// status and last line go to it as direct gets (fence.LastMsgVia). Until
// the count is known, and for replicas that may lag, the reads use the
// JSON API, which the leader answers. The count is read in the
// background, never on a run's path.
func (w *Worker) oneReplica() bool {
	if time.Since(time.Unix(0, w.replicasAt.Load())) > replicasMaxAge && !w.stopping.Load() && w.replicasIn.CompareAndSwap(false, true) {
		w.cleanup.Go(func() {
			defer w.replicasIn.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.PublishTimeout)
			defer cancel()
			st, err := w.js.Stream(ctx, w.names.QueriesStream())
			if err != nil {
				return
			}
			w.replicas.Store(int32(max(st.CachedInfo().Config.Replicas, 1)))
			w.replicasAt.Store(time.Now().UnixNano())
		})
	}
	return w.replicas.Load() == 1
}
