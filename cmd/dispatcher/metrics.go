package main

import (
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/fleetmetrics"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// queueMetrics is the collector of fleet_queue_depth, fleet_queue_wait_seconds
// and fleet_desired_workers.
func queueMetrics(nc *nats.Conn, names protocol.Names, workerSlots int) (*fleetmetrics.Collector, error) {
	c, err := fleetapi.NewClient(nc, names)
	if err != nil {
		return nil, err
	}
	return fleetmetrics.New(c, workerSlots)
}
