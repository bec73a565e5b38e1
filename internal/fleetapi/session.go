package fleetapi

import (
	"context"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// SessionOp sends a session op (input, interrupt, approve, end) to the
// dispatcher (<prefix>.api.<op>), which records it on the query's .ctl.
func (c *Client) SessionOp(ctx context.Context, op string, req protocol.SessionOpRequest) (protocol.APIReply, error) {
	if c.Local != nil {
		return c.Local.SessionOp(ctx, op, req)
	}
	var r protocol.APIReply
	err := c.request(ctx, c.Names.APISessionOp(op), req, &r)
	return r, err
}
