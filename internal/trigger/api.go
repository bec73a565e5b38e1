package trigger

import (
	"encoding/json"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Request is a request on <prefix>.api.trigger.
type Request struct {
	Action   string          `json:"action"` // add, ls, rm
	Tenant   string          `json:"tenant,omitempty"`
	Name     string          `json:"name,omitempty"`
	Template json.RawMessage `json:"template,omitempty"`
}

// Info is a trigger as the API answers it; Secret only on add.
type Info struct {
	Tenant   string          `json:"tenant"`
	Name     string          `json:"name"`
	Path     string          `json:"path"`
	Secret   string          `json:"secret,omitempty"`
	Template json.RawMessage `json:"template"`
	Created  string          `json:"created"`
}

// Reply answers a Request.
type Reply struct {
	Triggers []Info              `json:"triggers,omitempty"`
	Error    *protocol.ErrorInfo `json:"error,omitempty"`
}

// Subject is the subject of trigger requests.
func Subject(n protocol.Names) string { return n.Prefix() + ".api.trigger" }
