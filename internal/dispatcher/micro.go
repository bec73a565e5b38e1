package dispatcher

import (
	"fmt"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/internal/buildinfo"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// serveAPI registers the NATS micro service "agentfleet" whose endpoints
// are the API subjects, so `nats micro ls|info|stats agentfleet` find every
// dispatcher, its endpoints and their request counts, errors and latency.
// The endpoints share the queue group: one dispatcher answers each request.
func (s *Service) serveAPI() (micro.Service, error) {
	n := s.names
	svc, err := micro.AddService(s.cfg.NC, micro.Config{
		Name:        protocol.ServiceName,
		Version:     buildinfo.SemVer(),
		Description: "agentfleet dispatcher: submit, cancel, status and list of query jobs",
		QueueGroup:  queueGroup,
		Metadata:    map[string]string{"prefix": n.Prefix(), "build": buildinfo.Version()},
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: micro service: %w", err)
	}
	for _, ep := range []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"submit", n.APISubmit(), s.handleSubmit},
		{"cancel", n.APICancel(), s.handleCancel},
		{"status", n.APIStatus(), s.handleStatus},
		{"list", n.APIList(), s.handleList},
	} {
		if err := svc.AddEndpoint(ep.name, ep.h, micro.WithEndpointSubject(ep.subject)); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("dispatcher: endpoint %s: %w", ep.subject, err)
		}
	}
	return svc, nil
}
