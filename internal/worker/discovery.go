package worker

import (
	"slices"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Info describes the worker for discovery (the agentfleet-worker micro
// service's info endpoint): its state, slots and the jobs it runs.
func (w *Worker) Info() protocol.WorkerInfo {
	info := protocol.WorkerInfo{
		ID: w.cfg.ID, Version: buildinfo.Version(), Slots: w.cfg.Slots,
		Started: w.startedAt, ShutdownGrace: w.cfg.ShutdownGrace, State: protocol.WorkerWaiting,
		Running: []protocol.RunningJob{},
	}
	switch {
	case w.life.Stopping():
		info.State = protocol.WorkerDraining
	case w.Ready():
		info.State = protocol.WorkerPulling
	}
	w.runs.Range(func(_, v any) bool {
		info.Running = append(info.Running, v.(protocol.RunningJob))
		return true
	})
	slices.SortFunc(info.Running, func(a, b protocol.RunningJob) int { return a.Since.Compare(b.Since) })
	return info
}

// Running is how many jobs the worker runs now.
func (w *Worker) Running() int {
	n := 0
	w.runs.Range(func(_, _ any) bool { n++; return true })
	return n
}
