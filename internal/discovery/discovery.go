// Package discovery registers a worker as the NATS micro service
// "agentfleet-worker" (protocol.WorkerServiceName), so `nats micro ls`
// lists every worker and the dispatcher, the dashboard and the CLI find
// them (fleetapi.Client.Workers). Each worker has two endpoints:
//
//   - info  (<prefix>.worker.<id>.info): protocol.WorkerInfo, its state,
//     slots, running jobs and version;
//   - drain (<prefix>.worker.<id>.drain): stop pulling, let running jobs
//     finish within the shutdown grace (handing the rest back), then exit.
//     Jobs keep heartbeating while they finish. The reply is the worker's
//     info as the drain begins.
//
// The service is up from the worker's start until it has stopped, so a
// draining worker stays visible.
package discovery

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Worker is what the service asks of the worker.
type Worker struct {
	// ID is the worker's id. Required.
	ID string
	// Info describes the worker now. Required.
	Info func() protocol.WorkerInfo
	// Drain starts a graceful stop; it must return at once and may be
	// called more than once. Required.
	Drain func()
}

// ServeWorker registers w on nc. Stop the returned service after the
// worker has stopped.
func ServeWorker(nc *nats.Conn, names protocol.Names, w Worker) (micro.Service, error) {
	if w.ID == "" || w.Info == nil || w.Drain == nil {
		return nil, fmt.Errorf("discovery: ID, Info and Drain are required")
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        protocol.WorkerServiceName,
		Version:     buildinfo.SemVer(),
		Description: "agentfleet worker: info and drain",
		Metadata:    map[string]string{"worker": w.ID, "prefix": names.Prefix(), "build": buildinfo.Version()},
	})
	if err != nil {
		return nil, fmt.Errorf("discovery: micro service: %w", err)
	}
	respond := func(r micro.Request) {
		b, err := json.Marshal(w.Info())
		if err != nil {
			_ = r.Error("500", err.Error(), nil)
			return
		}
		_ = r.Respond(b)
	}
	eps := []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"info", names.WorkerInfoSubject(w.ID), respond},
		{"drain", names.WorkerDrainSubject(w.ID), func(r micro.Request) {
			w.Drain()
			respond(r)
		}},
	}
	for _, ep := range eps {
		// Every endpoint is this one worker's: no queue group.
		if err := svc.AddEndpoint(ep.name, ep.h, micro.WithEndpointSubject(ep.subject), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("discovery: endpoint %s: %w", ep.name, err)
		}
	}
	// Once the server has the subscriptions, a request right after
	// ServeWorker returns finds this worker. Not connected yet: they are
	// sent when the connection is made.
	if nc.IsConnected() {
		_ = nc.FlushTimeout(5 * time.Second)
	}
	return svc, nil
}
