package fleetapi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/fence"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// NewTenantClient is NewClient for a tenant's creds (docs/tenancy.md): its
// account reaches the fleet's JetStream API under apiPrefix
// ($JS.FLEET.API), and only the calls a reader of its own queries needs
// (no stream info).
func NewTenantClient(nc *nats.Conn, names protocol.Names, apiPrefix string) (*Client, error) {
	js, err := jetstream.NewWithAPIPrefix(nc, apiPrefix)
	if err != nil {
		return nil, err
	}
	return &Client{NC: nc, JS: js, Names: names, APIPrefix: apiPrefix}, nil
}

// lastMsg is the last message on subject of FLEET_QUERIES (wrapping
// jetstream.ErrMsgNotFound when there is none): read as fence reads it,
// or for a tenant through its API prefix with no stream info.
func (c *Client) lastMsg(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if c.APIPrefix == "" {
		return fence.LastMsg(ctx, c.NC, c.Names.QueriesStream(), subject)
	}
	js, err := c.NC.JetStream(nats.APIPrefix(c.APIPrefix), nats.Context(ctx))
	if err != nil {
		return nil, err
	}
	m, err := js.GetLastMsg(c.Names.QueriesStream(), subject, nats.Context(ctx))
	if errors.Is(err, nats.ErrMsgNotFound) {
		return nil, jetstream.ErrMsgNotFound
	}
	if err != nil {
		return nil, err
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Sequence, Header: m.Header, Data: m.Data, Time: m.Time}, nil
}

// lastStatus is the query's last status event on FLEET_QUERIES (nil for none).
func (c *Client) lastStatus(ctx context.Context, tenant, id string) (*protocol.StatusEvent, error) {
	if c.APIPrefix == "" {
		_, ev, err := fence.LastStatus(ctx, c.NC, c.Names.QueriesStream(), c.Names.QueryStatus(tenant, id))
		return ev, err
	}
	m, err := c.lastMsg(ctx, c.Names.QueryStatus(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ev protocol.StatusEvent
	if json.Unmarshal(m.Data, &ev) != nil {
		return nil, nil
	}
	return &ev, nil
}
