package protocol

import (
	"strings"
	"time"
)

// NATS micro services of the fleet (docs/operations.md): `nats micro ls|info|stats`
// find them.
const (
	// ServiceName is the dispatcher's service; its endpoints are the
	// <prefix>.api.* subjects.
	ServiceName = "agentfleet"
	// WorkerServiceName is each worker's service, with the endpoints
	// "info" (<prefix>.worker.<id>.info) and "drain"
	// (<prefix>.worker.<id>.drain).
	WorkerServiceName = "agentfleet-worker"
)

// Worker states in WorkerInfo.
const (
	WorkerWaiting  = "waiting"  // not pulling yet (no NATS, or no work consumer)
	WorkerPulling  = "pulling"  // pulling and running jobs
	WorkerDraining = "draining" // no new jobs; running ones finish or are handed back
)

// WorkerInfo is a worker's reply on its info endpoint.
type WorkerInfo struct {
	ID      string       `json:"id"`
	Version string       `json:"version"`
	State   string       `json:"state"`
	Slots   int          `json:"slots"`
	Running []RunningJob `json:"running"`
	Started time.Time    `json:"started"`
	// ShutdownGrace is how long running jobs may finish on a drain.
	ShutdownGrace time.Duration `json:"shutdown_grace_ns"`
}

// RunningJob is a job a worker runs.
type RunningJob struct {
	Tenant  string    `json:"tenant"`
	ID      string    `json:"id"`
	Attempt int       `json:"attempt"`
	Since   time.Time `json:"since"`
}

// WorkerInfoSubject is the info endpoint of worker id.
func (n Names) WorkerInfoSubject(id string) string { return n.p() + ".worker." + token(id) + ".info" }

// WorkerDrainSubject is the drain endpoint of worker id.
func (n Names) WorkerDrainSubject(id string) string { return n.p() + ".worker." + token(id) + ".drain" }

// token makes a worker id (a host name may have dots) one subject token.
func token(id string) string {
	return strings.NewReplacer(".", "_", " ", "_", "*", "_", ">", "_").Replace(id)
}
