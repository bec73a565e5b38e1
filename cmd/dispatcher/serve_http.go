package main

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/httpapi"
	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// startWebhooks starts the webhook deliveries (docs/webhooks.md): a consumer of
// their own on the status events, so they never slow the dispatcher.
func startWebhooks(ctx context.Context, nc *nats.Conn, names protocol.Names, f webhook.Flags, replicas int, log *zerolog.Logger) (*webhook.Service, error) {
	hooks, err := webhook.New(webhook.Config{NC: nc, Names: names, Backoff: f.Backoff, AllowPrivate: f.AllowPrivate, Replicas: replicas, Logger: log})
	if err != nil {
		return nil, err
	}
	return hooks, hooks.Start(ctx)
}

// withAPI serves /v1 (docs/http-api.md) beside ui. The operator's token is
// --ui-token; with none (and no tenant tokens), loopback is open as for the
// dashboard. tenantToken verifies tenant tokens (docs/tenancy.md; tenancy.VerifyToken
// with --auth-dir bound); nil: none are accepted.
func withAPI(client *fleetapi.Client, status, objects storage.Store, uiToken string, tenantToken func(string) (string, error), ui http.Handler, log *zerolog.Logger) (http.Handler, error) {
	auth := httpapi.Auth{OperatorToken: uiToken, TenantToken: tenantToken}
	api, err := httpapi.New(httpapi.Config{Client: client, Status: status, Objects: objects, Auth: auth, Logger: log})
	if err != nil {
		return nil, err
	}
	return httpapi.Mount(api, ui), nil
}
