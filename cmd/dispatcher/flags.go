package main

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/dispatcher"
	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/internal/pprofserve"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/internal/webhook"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// serveConfig is `dispatcher serve`'s configuration, from its flags (and
// their FLEET_* environment variables).
type serveConfig struct {
	common                        config.Common
	storageURL, statusURL         string
	httpAddr, pprofAddr, uiToken  string
	authDir                       string
	hooks                         webhook.Flags
	maxConc, maxDeliver, replicas int
	workerSlots                   int
	ackWait, maxAge, sessionTTL   time.Duration
	leaseTTL, rateLimitPause      time.Duration
	tenantDefaults                admission.Settings
	githubAppID                   int64
	githubKey, githubSecret       string
	githubAPI, publicURL          string
}

// flags is the flag table of `dispatcher serve`.
func (c *serveConfig) flags(fs *pflag.FlagSet) {
	config.AddCommon(fs, &c.common, "dispatcher")
	fs.StringVar(&c.storageURL, "storage", "file://./data", "transcript storage URL (env FLEET_STORAGE)")
	fs.StringVar(&c.statusURL, "status-storage", "", "status storage URL; defaults to --storage (env FLEET_STATUS_STORAGE)")
	fs.StringVar(&c.httpAddr, "http", "127.0.0.1:0", "address for /healthz, /readyz, /metrics and the dashboard at /; 127.0.0.1:0 = off (env FLEET_HTTP)")
	fs.StringVar(&c.uiToken, "ui-token", "", "token the dashboard requires (Authorization: Bearer, or /login); unset: loopback clients only (env FLEET_UI_TOKEN)")
	fs.StringVar(&c.authDir, "auth-dir", "", "the directory of 'auth init': the dashboard takes its tenants' tokens, each reaching only its tenant (env FLEET_AUTH_DIR)")
	webhook.AddFlags(fs, &c.hooks)
	fs.IntVar(&c.maxConc, "max-concurrency", 64, "fleet-wide concurrency: the work consumer's MaxAckPending (env FLEET_MAX_CONCURRENCY)")
	fs.DurationVar(&c.ackWait, "ack-wait", 30*time.Second, "work consumer ack deadline; workers heartbeat within it (env FLEET_ACK_WAIT)")
	fs.IntVar(&c.maxDeliver, "max-deliver", 5, "attempts before a job is dead-lettered (env FLEET_MAX_DELIVER)")
	fs.DurationVar(&c.maxAge, "queries-max-age", 7*24*time.Hour, "how long per-query messages are kept for replay (env FLEET_QUERIES_MAX_AGE)")
	fs.DurationVar(&c.sessionTTL, "session-ttl", 7*24*time.Hour, "a session parked for longer ends as succeeded (env FLEET_SESSION_TTL)")
	pprofserve.AddFlag(fs, &c.pprofAddr)
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of the streams and of nats:// storage buckets (3 on a cluster) (env FLEET_REPLICAS)")
	fs.IntVar(&c.workerSlots, "worker-slots", 4, "slots of one worker, for the fleet_desired_workers metric (env FLEET_WORKER_SLOTS)")
	fs.IntVar(&c.tenantDefaults.MaxRunning, "tenant-max-running", 0, "runs at once of a tenant without settings; 0 = only the fleet's cap (env FLEET_TENANT_MAX_RUNNING)")
	fs.Float64Var(&c.tenantDefaults.Weight, "tenant-weight", 1, "fair-share weight of a tenant without settings (env FLEET_TENANT_WEIGHT)")
	fs.DurationVar(&c.leaseTTL, "admitter-lease", 5*time.Second, "the admitter's leadership lease; a standby dispatcher takes over about this long after the admitting one dies (env FLEET_ADMITTER_LEASE)")
	fs.Int64Var(&c.githubAppID, "github-app-id", 0, "the GitHub App whose webhooks (POST /v1/github) start jobs; 0 = none (env FLEET_GITHUB_APP_ID)")
	fs.StringVar(&c.githubKey, "github-private-key", "", "the GitHub App's private key, a PEM file (RS256) (env FLEET_GITHUB_PRIVATE_KEY)")
	fs.StringVar(&c.githubSecret, "github-webhook-secret", "", "the GitHub App's webhook secret (env FLEET_GITHUB_WEBHOOK_SECRET)")
	fs.StringVar(&c.githubAPI, "github-api-url", github.DefaultAPIURL, "GitHub's REST API (GitHub Enterprise: https://HOST/api/v3/) (env FLEET_GITHUB_API_URL)")
	fs.StringVar(&c.publicURL, "public-url", "", "the dashboard's public base URL, linked from GitHub comments; default http://<--http> (env FLEET_PUBLIC_URL)")
	fs.DurationVar(&c.rateLimitPause, "rate-limit-pause", time.Minute, "how long a tenant pauses after an API 429 with no reset time (env FLEET_RATE_LIMIT_PAUSE)")
}

// validate rejects values that can never work, at once and with a usage
// error, instead of a start that retries them forever (they are not a
// transient failure) or a zero that silently becomes a default.
func (c serveConfig) validate() error {
	switch {
	case c.maxConc < 1:
		return fmt.Errorf("--max-concurrency %d: must be at least 1", c.maxConc)
	case c.maxDeliver < 1:
		return fmt.Errorf("--max-deliver %d: must be at least 1", c.maxDeliver)
	case c.replicas < 1 || c.replicas > 5:
		return fmt.Errorf("--replicas %d: must be between 1 and 5", c.replicas)
	case c.ackWait < time.Second:
		return fmt.Errorf("--ack-wait %s: must be at least 1s", c.ackWait)
	case c.maxAge < time.Minute:
		return fmt.Errorf("--queries-max-age %s: must be at least 1m (queries are replayed from it)", c.maxAge)
	case c.sessionTTL <= 0:
		return fmt.Errorf("--session-ttl %s: must be positive", c.sessionTTL)
	case c.leaseTTL < time.Second:
		return fmt.Errorf("--admitter-lease %s: must be at least 1s", c.leaseTTL)
	case c.rateLimitPause <= 0:
		return fmt.Errorf("--rate-limit-pause %s: must be positive", c.rateLimitPause)
	}
	if _, err := c.githubApp(); err != nil {
		return err
	}
	return c.hooks.Check()
}

// githubApp is the GitHub App of the --github-* flags, nil without
// --github-app-id.
func (c serveConfig) githubApp() (*github.App, error) {
	if c.githubAppID == 0 {
		if c.githubKey != "" || c.githubSecret != "" {
			return nil, fmt.Errorf("--github-private-key and --github-webhook-secret need --github-app-id")
		}
		return nil, nil
	}
	if c.githubKey == "" {
		return nil, fmt.Errorf("--github-private-key: required with --github-app-id")
	}
	key, err := github.LoadKey(c.githubKey)
	if err != nil {
		return nil, err
	}
	return github.NewApp(github.AppConfig{ID: c.githubAppID, PrivateKey: key, WebhookSecret: c.githubSecret, APIURL: c.githubAPI})
}

// dispatcher is the dispatcher's configuration.
func (c serveConfig) dispatcher(nc *nats.Conn, status, objects storage.Store, log *zerolog.Logger) dispatcher.Config {
	return dispatcher.Config{
		NC: nc, Status: status, Objects: objects, Logger: log, SessionTTL: c.sessionTTL,
		Provision: provision.Config{Names: protocol.NewNames(c.common.Prefix), MaxConcurrency: c.maxConc, AckWait: c.ackWait,
			MaxDeliver: c.maxDeliver, QueriesMaxAge: c.maxAge, Replicas: c.replicas},
		Admission: admission.Config{Policy: admission.Policy{Defaults: c.tenantDefaults}, LeaseTTL: c.leaseTTL, RateLimitPause: c.rateLimitPause},
		PublicURL: c.publicURL,
	}
}
