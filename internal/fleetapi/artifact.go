package fleetapi

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Artifact returns the workspace manifest of a query, read from the
// query's .artifact subject (kept by FLEET_QUERIES). It wraps
// jetstream.ErrMsgNotFound when the query has none (yet).
func (c *Client) Artifact(ctx context.Context, tenant, id string) (protocol.Artifact, error) {
	m, err := c.lastMsg(ctx, c.Names.QueryArtifact(tenant, id))
	if err != nil {
		return protocol.Artifact{}, err
	}
	var a protocol.Artifact
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return protocol.Artifact{}, fmt.Errorf("fleet: artifact of %s/%s: %w", tenant, id, err)
	}
	return a, nil
}
