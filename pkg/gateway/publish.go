package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// JetStreamPublisher publishes each Event as JSON on the query's .model
// subject (stored in the queries stream), asynchronously, with
// Nats-Msg-Id <tenant>.<id>.model.<attempt>.<call> so a resent event is
// stored once.
type JetStreamPublisher struct {
	JS    jetstream.JetStream
	Names protocol.Names
	// Logger receives publish failures. nil drops them.
	Logger *zerolog.Logger
}

// PublishModel implements Publisher.
func (p JetStreamPublisher) PublishModel(run RunInfo, ev Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return // an Event always marshals
	}
	msg := &nats.Msg{Subject: p.Names.QueryModel(run.Tenant, run.QueryID), Data: b, Header: nats.Header{}}
	msg.Header.Set("Content-Type", "application/json")
	id := fmt.Sprintf("%s.%s.model.%d.%d", run.Tenant, run.QueryID, run.Attempt, ev.Call)
	fut, err := p.JS.PublishMsgAsync(msg, jetstream.WithMsgID(id))
	if err != nil {
		p.failed(run, ev, err)
		return
	}
	// The ack is awaited (bounded) off the call's path, so a refused or
	// lost publish is said, not only seen as a missing record later.
	go func() {
		t := time.NewTimer(publishTimeout)
		defer t.Stop()
		select {
		case <-fut.Ok():
		case err := <-fut.Err():
			p.failed(run, ev, err)
		case <-t.C:
			p.failed(run, ev, fmt.Errorf("no ack from JetStream within %s on %s (may these creds publish it?)", publishTimeout, msg.Subject))
		}
	}()
}

// publishTimeout bounds waiting for a .model event's ack.
const publishTimeout = 5 * time.Second

func (p JetStreamPublisher) failed(run RunInfo, ev Event, err error) {
	if p.Logger != nil {
		p.Logger.Error().Err(err).Str("tenant", run.Tenant).Str("query_id", run.QueryID).Int("call", ev.Call).Msg("model event not stored")
	}
}

// LastCall returns the last .model event stored for a query, so that a
// later attempt or turn numbers its calls on (RunInfo.FirstCall =
// LastCall's Call + 1). A query with none gives a zero Event.
func LastCall(ctx context.Context, js jetstream.JetStream, names protocol.Names, tenant, id string) (Event, error) {
	s, err := js.Stream(ctx, names.QueriesStream())
	if err != nil {
		return Event{}, fmt.Errorf("gateway: last model call: %w", err)
	}
	m, err := s.GetLastMsgForSubject(ctx, names.QueryModel(tenant, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Event{}, nil
	}
	if err != nil {
		return Event{}, fmt.Errorf("gateway: last model call: %w", err)
	}
	return DecodeEvent(m.Data)
}

// DecodeEvent reads a .model event.
func DecodeEvent(b []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return Event{}, fmt.Errorf("gateway: model event: %w", err)
	}
	if ev.Call < 0 {
		return Event{}, fmt.Errorf("gateway: model event: call %d is negative", ev.Call)
	}
	return ev, nil
}
