package github

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/bradleyfalzon/ghinstallation/v2"
	"github.com/golang-jwt/jwt/v4"
	gh "github.com/google/go-github/v89/github"
)

// DefaultAPIURL is GitHub's REST API.
const DefaultAPIURL = "https://api.github.com/"

// AppConfig is a GitHub App's identity as `dispatcher serve` takes it.
type AppConfig struct {
	ID            int64
	PrivateKey    []byte // PEM, RSA
	WebhookSecret string
	APIURL        string // "" = DefaultAPIURL; ends in "/"
	// HTTP is the transport of API calls; nil = http.DefaultTransport.
	HTTP http.RoundTripper
}

// App is a GitHub App: it verifies webhooks with its secret, signs JWTs
// (RS256) with its key and mints installation tokens with them.
type App struct {
	id     int64
	key    *rsa.PrivateKey
	secret []byte
	api    string
	tr     http.RoundTripper
}

// LoadKey reads a PEM RSA private key file.
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--github-private-key: %w", err)
	}
	return b, nil
}

// NewApp checks cfg and returns the App.
func NewApp(cfg AppConfig) (*App, error) {
	if cfg.ID <= 0 {
		return nil, errors.New("--github-app-id: required (a positive number)")
	}
	if cfg.WebhookSecret == "" {
		return nil, errors.New("--github-webhook-secret: required with --github-app-id")
	}
	key, err := jwt.ParseRSAPrivateKeyFromPEM(cfg.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("--github-private-key: not a PEM RSA private key: %w", err)
	}
	api := cfg.APIURL
	if api == "" {
		api = DefaultAPIURL
	}
	u, err := url.Parse(api)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("--github-api-url %q: want an http(s) URL", api)
	}
	if !strings.HasSuffix(api, "/") {
		api += "/"
	}
	tr := cfg.HTTP
	if tr == nil {
		tr = http.DefaultTransport
	}
	return &App{id: cfg.ID, key: key, secret: []byte(cfg.WebhookSecret), api: api, tr: tr}, nil
}

// client is a go-github client on the App's API URL over rt.
func (a *App) client(rt http.RoundTripper, token string) *gh.Client {
	opts := []gh.ClientOptionsFunc{gh.WithHTTPClient(&http.Client{Transport: rt}), gh.WithURLs(&a.api, &a.api)}
	if token != "" {
		opts = append(opts, gh.WithAuthToken(token))
	}
	c, err := gh.NewClient(opts...)
	if err != nil { // a.api was checked in NewApp
		panic(err)
	}
	return c
}

// appClient authenticates as the App itself (a JWT signed RS256 per
// request, by ghinstallation).
func (a *App) appClient() *gh.Client {
	at := ghinstallation.NewAppsTransportFromPrivateKey(a.tr, a.id, a.key)
	at.BaseURL = strings.TrimSuffix(a.api, "/")
	return a.client(at, "")
}

// Token mints an installation access token scoped to the one repository
// name (without its owner) of the installation.
func (a *App) Token(ctx context.Context, installation int64, name string) (string, error) {
	tok, _, err := a.appClient().Apps.CreateInstallationToken(ctx, installation, &gh.InstallationTokenOptions{Repositories: []string{name}})
	if err != nil {
		return "", err
	}
	return tok.GetToken(), nil
}

// As is a client acting as the installation (with a token from Token).
func (a *App) As(token string) *gh.Client { return a.client(a.tr, token) }

// StatusCode is the HTTP status of a failed API call, 0 when it got none.
func StatusCode(err error) int {
	var e *gh.ErrorResponse
	if errors.As(err, &e) && e.Response != nil {
		return e.Response.StatusCode
	}
	return 0
}
