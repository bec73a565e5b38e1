package main

// The model gateway (docs/gateway.md, pkg/gateway): the worker's model
// credential stays in the worker; each run's agent gets the gateway's URL
// and a token of its own.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/gateway"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// modelOff is the --model-upstream that runs the worker without a gateway:
// the agents then get no model credential at all.
const modelOff = "off"

// credentialFlagsError refuses the model's variables in the lists of
// variables the agent may get (--agent-env) or a job may set
// (--job-env-allow).
func credentialFlagsError(agentEnv, jobEnvAllow []string) error {
	for _, l := range []struct {
		flag  string
		names []string
	}{{"--agent-env", agentEnv}, {"--job-env-allow", jobEnvAllow}} {
		for _, n := range l.names {
			if worker.ReservedModelEnv(n) {
				return fmt.Errorf("%s may not list %s: the model credential stays in the worker, and the agent gets the model gateway's URL and a token of its run instead (--model-upstream)", l.flag, n)
			}
		}
	}
	return nil
}

// checkModelFlags validates --model-upstream and loads --model-prices.
func (o *options) checkModelFlags() error {
	if err := credentialFlagsError(o.agentEnv, o.jobEnvAllow); err != nil {
		return err
	}
	if o.modelUpstream != modelOff {
		u, err := url.Parse(o.modelUpstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--model-upstream must be an http(s) URL or %q, not %q", modelOff, o.modelUpstream)
		}
	}
	if o.modelPricesFile != "" {
		p, err := gateway.LoadPrices(o.modelPricesFile)
		if err != nil {
			return fmt.Errorf("--model-prices %s: %w", o.modelPricesFile, err)
		}
		o.modelPrices = p
	}
	return nil
}

// startGateway starts the model gateway with the worker's credential, or
// returns nil (said in the log) when --model-upstream is off or the worker
// has no credential: then no agent gets one.
func startGateway(o *options, nc *nats.Conn, js jetstream.JetStream, names protocol.Names, log zerolog.Logger) (*gateway.Gateway, error) {
	if o.modelUpstream == modelOff {
		log.Warn().Msg("--model-upstream off: no model gateway, and agents get no model credential")
		return nil, nil
	}
	cfg := gateway.Config{
		Upstream: o.modelUpstream, Prices: o.modelPrices, Logger: &log, Tracing: o.tracing,
		Publisher:   gateway.JetStreamPublisher{JS: js, Names: names, Logger: &log},
		OnRateLimit: worker.ForwardRateLimits(nc, names, log),
	}
	cfg.CredentialsFromEnv(os.Getenv)
	if cfg.APIKey == "" && cfg.OAuthToken == "" && cfg.AuthToken == "" {
		log.Warn().Str("credentials", strings.Join(gateway.CredentialEnv, ", ")).
			Msg("no model credential in the worker's environment: no model gateway, and agents get no model credential")
		return nil, nil
	}
	gw, err := gateway.Start(cfg)
	if err != nil {
		return nil, failed(2, "model gateway", err)
	}
	log.Info().Str("upstream", upstreamForLog(o.modelUpstream)).Str("url", gw.URL()).Msg("model gateway started")
	return gw, nil
}

// upstreamForLog is an upstream URL for the log, without any user info.
func upstreamForLog(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.User = nil
	return u.String()
}

// stopGateway stops the gateway once the worker's runs have ended.
func stopGateway(gw *gateway.Gateway, log zerolog.Logger) {
	if gw == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopMargin)
	defer cancel()
	if err := gw.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn().Err(err).Msg("stopping the model gateway")
	}
}
