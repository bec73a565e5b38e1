package worker

import (
	"fmt"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
)

// Limits (docs/contained.md): a job's cgroup v2 limits in a contained sandbox. The
// provider fills what a job leaves zero from the worker's defaults; a job
// asking above the worker's maximums is refused when it is taken, before
// any sandbox or process exists.

// errLimitsNotAllowed is a job's limits above the worker's maximums.
type errLimitsNotAllowed struct{ err error }

func (e errLimitsNotAllowed) Error() string {
	return fmt.Sprintf("the job's limits are above this worker's maximums: %v", e.err)
}

func (e errLimitsNotAllowed) Unwrap() error { return e.err }

// jobLimits is what job asks, as the sandbox's limits; an error when it is
// above max (Config.LimitsMax).
func jobLimits(job *protocol.Job, max sandbox.Limits) (sandbox.Limits, error) {
	l := job.Limits
	if l == nil {
		return sandbox.Limits{}, nil
	}
	asked := sandbox.Limits{MemoryBytes: l.MemoryMB << 20, Pids: l.Pids, CPUWeight: l.CPUWeight}
	if err := asked.Within(max); err != nil {
		return sandbox.Limits{}, errLimitsNotAllowed{err}
	}
	return asked, nil
}

// withLimits gives the attempt's sandbox the job's limits (checked when the
// job was taken).
func (q *query) withLimits(spec sandbox.Spec) sandbox.Spec {
	l, err := jobLimits(q.job, q.w.cfg.LimitsMax)
	if err != nil {
		q.log.Error().Err(err).Msg("the job's limits, accepted when it was taken, are refused now")
		return spec
	}
	spec.Limits = l
	return spec
}
