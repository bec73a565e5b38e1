package main

import (
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// queueMetrics is the collector of fleet_queue_depth, fleet_queue_wait_seconds,
// fleet_desired_workers and fleet_held_jobs; defaults are the settings of
// tenants without their own.
func queueMetrics(nc *nats.Conn, names protocol.Names, workerSlots int, defaults admission.Settings) (*fleetmetrics.Collector, error) {
	c, err := fleetapi.NewClient(nc, names)
	if err != nil {
		return nil, err
	}
	q, err := fleetmetrics.New(c, workerSlots)
	if err != nil {
		return nil, err
	}
	return q.WithTenantDefaults(defaults), nil
}
