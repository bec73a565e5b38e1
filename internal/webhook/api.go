package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// API operations, on <prefix>.api.webhook.<op>.
const (
	OpAdd        = "add"
	OpList       = "ls"
	OpRemove     = "rm"
	OpDeliveries = "deliveries"
	// OpFailing lists failing deliveries of every tenant (no tenant in
	// the request): the dashboard's, for operators.
	OpFailing = "failing"
)

// Subject is the request subject of op.
func Subject(n protocol.Names, op string) string { return n.Prefix() + ".api.webhook." + op }

// Request is every webhook API request.
type Request struct {
	Tenant   string   `json:"tenant"`
	URL      string   `json:"url,omitempty"`
	Events   []string `json:"events,omitempty"`
	Endpoint string   `json:"endpoint,omitempty"`
}

// Reply is every webhook API reply.
type Reply struct {
	Endpoint   *Endpoint           `json:"endpoint,omitempty"`
	Endpoints  []Endpoint          `json:"endpoints,omitempty"`
	Deliveries []Delivery          `json:"deliveries,omitempty"`
	Error      *protocol.ErrorInfo `json:"error,omitempty"`
}

// Error codes of replies.
const (
	CodeInvalid  = "invalid"
	CodeNotFound = "not_found"
	CodeInternal = "internal"
)

// maxDeliveries bounds a deliveries reply (newest first).
const maxDeliveries = 200

func (s *Service) serveAPI() error {
	for _, op := range []string{OpAdd, OpList, OpRemove, OpDeliveries, OpFailing} {
		sub, err := s.cfg.NC.QueueSubscribe(Subject(s.cfg.Names, op), "webhook-api", func(m *nats.Msg) {
			ctx, cancel := context.WithTimeout(s.ctx, 15*time.Second)
			defer cancel()
			rep := s.handle(ctx, op, m.Data)
			b, _ := json.Marshal(rep)
			_ = m.Respond(b)
		})
		if err != nil {
			return fmt.Errorf("webhook: serving %s: %w", op, err)
		}
		s.subs = append(s.subs, sub)
	}
	return nil
}

func fail(code, format string, a ...any) Reply {
	return Reply{Error: &protocol.ErrorInfo{Code: code, Message: fmt.Sprintf(format, a...)}}
}

// DecodeRequest reads and checks a request of op.
func DecodeRequest(op string, b []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(b, &req); err != nil {
		return req, fmt.Errorf("the request must be JSON {tenant,url,events,endpoint}: %w", err)
	}
	if op == OpFailing && req.Tenant == "" {
		return req, nil
	}
	if !protocol.ValidTenant(req.Tenant) {
		return req, fmt.Errorf("tenant %q: must match %s", req.Tenant, protocol.TenantPattern)
	}
	switch op {
	case OpAdd:
		if req.URL == "" {
			return req, errors.New("url: required")
		}
		for _, e := range req.Events {
			if !slices.Contains(Events, e) {
				return req, fmt.Errorf("events: %q is not one of %s", e, strings.Join(Events, ","))
			}
		}
	case OpRemove:
		if req.Endpoint == "" {
			return req, errors.New("endpoint: required")
		}
	}
	if req.Endpoint != "" && !protocol.ValidID(req.Endpoint) {
		return req, fmt.Errorf("endpoint %q: not an endpoint id", req.Endpoint)
	}
	return req, nil
}

func (s *Service) handle(ctx context.Context, op string, b []byte) Reply {
	req, err := DecodeRequest(op, b)
	if err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	switch op {
	case OpAdd:
		return s.add(ctx, req)
	case OpList:
		s.mu.Lock()
		defer s.mu.Unlock()
		out := []Endpoint{}
		for _, ep := range s.byTen[req.Tenant] {
			ep.Secret = ""
			out = append(out, ep)
		}
		slices.SortFunc(out, func(a, b Endpoint) int { return a.Created.Compare(b.Created) })
		return Reply{Endpoints: out}
	case OpRemove:
		if _, err := s.endpoints.Get(ctx, endpointKey(req.Tenant, req.Endpoint)); err != nil {
			return fail(CodeNotFound, "tenant %s has no webhook endpoint %s", req.Tenant, req.Endpoint)
		}
		if err := s.endpoints.Delete(ctx, endpointKey(req.Tenant, req.Endpoint)); err != nil {
			return fail(CodeInternal, "%v", err)
		}
		// Gone from ls at once, as an add is there at once (the watch
		// follows, and closes its sender).
		s.mu.Lock()
		delete(s.byTen[req.Tenant], req.Endpoint)
		s.mu.Unlock()
		return Reply{}
	default:
		return s.deliveries(ctx, op, req)
	}
}

func (s *Service) add(ctx context.Context, req Request) Reply {
	if err := CheckURL(ctx, req.URL, s.cfg.AllowPrivate, s.cfg.Lookup); err != nil {
		return fail(CodeInvalid, "%v", err)
	}
	events := req.Events
	if len(events) == 0 {
		events = slices.Clone(Events)
	}
	secret, err := newSecret()
	if err != nil {
		return fail(CodeInternal, "%v", err)
	}
	ep := Endpoint{ID: newEndpointID(), Tenant: req.Tenant, URL: req.URL, Events: events, Secret: secret, Created: s.cfg.Now().UTC()}
	b, _ := json.Marshal(ep)
	if _, err := s.endpoints.Create(ctx, endpointKey(ep.Tenant, ep.ID), b); err != nil {
		return fail(CodeInternal, "%v", err)
	}
	// Known here at once (the watch follows): events from now on match.
	s.mu.Lock()
	if s.byTen[ep.Tenant] == nil {
		s.byTen[ep.Tenant] = map[string]Endpoint{}
	}
	s.byTen[ep.Tenant][ep.ID] = ep
	s.mu.Unlock()
	s.log.Info().Str("tenant", ep.Tenant).Str("endpoint", ep.ID).Msg("webhook endpoint added")
	return Reply{Endpoint: &ep}
}

func (s *Service) deliveries(ctx context.Context, op string, req Request) Reply {
	prefix := req.Tenant + ".*.*"
	switch {
	case req.Tenant == "":
		prefix = "*.*.*"
	case req.Endpoint != "":
		prefix = req.Tenant + "." + req.Endpoint + ".*"
	}
	kl, err := s.delivs.ListKeysFiltered(ctx, prefix)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return Reply{Deliveries: []Delivery{}}
		}
		return fail(CodeInternal, "%v", err)
	}
	out := []Delivery{}
	for k := range kl.Keys() {
		e, err := s.delivs.Get(ctx, k)
		if err != nil {
			continue
		}
		var d Delivery
		if json.Unmarshal(e.Value(), &d) == nil && (op != OpFailing || !d.Done && len(d.Attempts) > 0) {
			d.Body = nil
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b Delivery) int { return b.Created.Compare(a.Created) })
	if len(out) > maxDeliveries {
		out = out[:maxDeliveries]
	}
	return Reply{Deliveries: out}
}

// Call sends a webhook API request and returns its reply; a reply with an
// error is returned as is.
func Call(ctx context.Context, nc *nats.Conn, n protocol.Names, op string, req Request) (Reply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	m, err := nc.RequestWithContext(ctx, Subject(n, op), b)
	if err != nil {
		return Reply{}, fmt.Errorf("the webhook API (%s) did not answer: is `dispatcher serve` running? %w", Subject(n, op), err)
	}
	var rep Reply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return Reply{}, fmt.Errorf("unreadable webhook API reply: %w", err)
	}
	return rep, nil
}
