package workspacetest

import (
	"testing"

	"github.com/agentfleet/agentfleet/pkg/workspace"
)

// newWorkspaces is workspace.New with the provider's Config changes.
func (s *suite) newWorkspaces(t *testing.T, cfg workspace.Config) (*workspace.Workspaces, error) {
	if s.f.Config != nil {
		s.f.Config(t, &cfg)
	}
	return workspace.New(cfg)
}
