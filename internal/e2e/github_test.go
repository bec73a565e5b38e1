package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v4"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/github"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/workspace/workspacetest"
)

// fakeGitHub plays GitHub's REST API for one App: it checks every
// App-authenticated call's JWT (RS256, signed by the App's key, issued by
// the App), mints installation tokens, serves pull requests, and records
// every call.
type fakeGitHub struct {
	t      *testing.T
	srv    *httptest.Server
	key    *rsa.PrivateKey
	appID  int64
	token  string
	mu     sync.Mutex
	calls  []ghCall
	notify chan ghCall
	// fail5xx makes every call but token minting answer 502.
	fail5xx bool
}

type ghCall struct {
	Method, Path, Auth string
	Body               map[string]any
}

func newFakeGitHub(t *testing.T, appID int64, token string) *fakeGitHub {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	g := &fakeGitHub{t: t, key: key, appID: appID, token: token, notify: make(chan ghCall, 64)}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGitHub) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(g.key)})
}

func (g *fakeGitHub) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c := ghCall{Method: r.Method, Path: r.URL.Path, Auth: r.Header.Get("Authorization")}
	_ = json.Unmarshal(body, &c.Body)
	g.mu.Lock()
	g.calls = append(g.calls, c)
	fail := g.fail5xx
	g.mu.Unlock()
	select {
	case g.notify <- c:
	default:
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/app/installations/"):
		if err := g.checkJWT(c.Auth); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"message":%q}`, err.Error())
			return
		}
		if r.URL.Path != "/app/installations/42/access_tokens" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"message":"Not Found"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"token":%q,"expires_at":%q}`, g.token, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	case fail:
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, `{"message":"bad gateway"}`)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/repos/acme/widgets/pulls/"):
		fmt.Fprint(w, `{"number":9,"head":{"ref":"feature","repo":{"full_name":"acme/widgets"}},"base":{"ref":"main"}}`)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/comments"):
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":1}`)
	case r.Method == http.MethodPost && r.URL.Path == "/repos/acme/widgets/pulls":
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"number":10,"html_url":"https://github.example/acme/widgets/pull/10"}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"message":"Not Found"}`)
	}
}

// checkJWT verifies an App JWT: RS256 with the App's key, issued by it.
func (g *fakeGitHub) checkJWT(auth string) error {
	raw, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return fmt.Errorf("no bearer JWT: %q", auth)
	}
	claims := jwt.RegisteredClaims{}
	tok, err := jwt.ParseWithClaims(raw, &claims, func(t *jwt.Token) (any, error) {
		if t.Method.Alg() != "RS256" {
			return nil, fmt.Errorf("alg %s", t.Method.Alg())
		}
		return &g.key.PublicKey, nil
	})
	if err != nil || !tok.Valid {
		return fmt.Errorf("the JWT does not verify: %w", err)
	}
	if claims.Issuer != strconv.FormatInt(g.appID, 10) {
		return fmt.Errorf("issuer %q", claims.Issuer)
	}
	return nil
}

func (g *fakeGitHub) callsTo(method, prefix string) []ghCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []ghCall
	for _, c := range g.calls {
		if c.Method == method && strings.HasPrefix(c.Path, prefix) {
			out = append(out, c)
		}
	}
	return out
}

// issueComment is an issue_comment "created" payload on acme/widgets.
func issueComment(cloneURL, comment, login, userType string, pr bool) []byte {
	issue := map[string]any{"number": 7, "title": "Widgets break", "body": "They break on Tuesdays.",
		"html_url": "https://github.example/acme/widgets/issues/7", "user": map[string]any{"login": "carol"}}
	if pr {
		issue["number"] = 9
		issue["html_url"] = "https://github.example/acme/widgets/pull/9"
		issue["pull_request"] = map[string]any{"url": "x"}
	}
	b, _ := json.Marshal(map[string]any{
		"action": "created", "issue": issue,
		"comment":      map[string]any{"body": comment, "user": map[string]any{"login": login, "type": userType}},
		"repository":   map[string]any{"full_name": "acme/widgets", "name": "widgets", "owner": map[string]any{"login": "acme"}, "clone_url": cloneURL, "default_branch": "main"},
		"sender":       map[string]any{"login": login, "type": userType},
		"installation": map[string]any{"id": 42},
	})
	return b
}

func postGitHub(t *testing.T, url, secret, event, delivery string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", delivery)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func githubRequest(t *testing.T, f *fleettest.Fleet, req github.Request) github.Reply {
	t.Helper()
	b, _ := json.Marshal(req)
	m, err := f.NC.Request(github.Subject(f.Names), b, 30*time.Second)
	require.NoError(t, err)
	var rep github.Reply
	require.NoError(t, json.Unmarshal(m.Data, &rep))
	return rep
}

// githubFleet is a fleet with a GitHub App on a fake GitHub, a worker, and
// acme/widgets served over smart HTTP where the App's installation token
// is the password.
func githubFleet(t *testing.T, token string, backoff ...time.Duration) (*fleettest.Fleet, *fakeGitHub, *workspacetest.Repo, string, string) {
	t.Helper()
	const secret = "hook-secret"
	g := newFakeGitHub(t, 1234, token)
	app, err := github.NewApp(github.AppConfig{ID: 1234, PrivateKey: g.pem(), WebhookSecret: secret, APIURL: g.srv.URL + "/"})
	require.NoError(t, err)
	f := fleettest.New(t, fleettest.Opts{GitHub: app, PublicURL: "https://fleet.example", GitHubBackoff: backoff})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	tmp := t.TempDir()
	repo := workspacetest.NewRepo(t, tmp)
	gsrv := workspacetest.Serve(t, tmp, "x-access-token", token)
	srv := httptest.NewServer(f.Disp.Inbound(http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	return f, g, repo, srv.URL + "/v1/github", gsrv.URL + "/origin.git"
}

// TestGitHubCommentStartsAWorkspaceRun: a signed comment mentioning the
// app starts one workspace job of the rule's tenant on the repository's
// clone URL, whose clone and push use an installation token minted for
// it (scoped to the repository, by a JWT the App signed) that the agent
// never sees; a redelivery starts nothing new; bad signatures, unknown
// repositories and installations, the app's own comments, comments
// without a mention and oversized bodies start nothing.
func TestGitHubCommentStartsAWorkspaceRun(t *testing.T) {
	t.Parallel()
	const token = "ghs_inst4llT0ken"
	f, g, repo, url, cloneURL := githubFleet(t, token)
	rep := githubRequest(t, f, github.Request{Action: "add", Tenant: "acme", Repo: "acme/widgets", Rule: &github.Rule{
		Handle: "fleetbot", PromptTemplate: "/standin dumpenv=1 cat=.git/config append=fix.txt commit=fix_{{ .Number }}",
	}})
	require.Nil(t, rep.Error)

	code, out := postGitHub(t, url, "hook-secret", "issue_comment", "d-1", issueComment(cloneURL, "@fleetbot please fix", "carol", "User", false))
	require.Equal(t, http.StatusAccepted, code, "%v", out)
	id := out["id"].(string)
	require.Equal(t, github.JobID("d-1"), id)
	r := f.Follow("acme", id, wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State, "%+v", r.Final)
	require.Equal(t, &protocol.Trigger{Kind: protocol.TriggerGitHub, Event: "issue_comment", Delivery: "d-1",
		URL: "https://github.example/acme/widgets/issues/7"}, r.Final.Trigger)
	require.True(t, r.Final.Workspace.Pushed, "%+v", r.Final.Workspace)
	require.Equal(t, "agentfleet/"+id, r.Final.Workspace.Branch)
	require.Equal(t, r.Final.Workspace.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/agentfleet/"+id))
	// The agent dumped its environment and .git/config: no token there.
	var seen strings.Builder
	for _, l := range r.Lines {
		seen.Write(l.Data)
	}
	require.Contains(t, seen.String(), "origin.git", "the agent's .git/config was read")
	require.NotContains(t, seen.String(), token)
	st, _ := json.Marshal(r.Statuses)
	require.NotContains(t, string(st), token)

	// A redelivery: the same job, no new token.
	code, out = postGitHub(t, url, "hook-secret", "issue_comment", "d-1", issueComment(cloneURL, "@fleetbot please fix", "carol", "User", false))
	require.Equal(t, http.StatusAccepted, code)
	require.Equal(t, true, out["duplicate"])

	huge := append(issueComment(cloneURL, "@fleetbot x", "carol", "User", false), bytes.Repeat([]byte(" "), github.MaxBody)...)
	other := bytes.ReplaceAll(issueComment(cloneURL, "@fleetbot x", "carol", "User", false), []byte("acme/widgets"), []byte("acme/gadgets"))
	noInst := bytes.ReplaceAll(issueComment(cloneURL, "@fleetbot x", "carol", "User", false), []byte(`"installation":{"id":42}`), []byte(`"installation":{"id":43}`))
	for _, c := range []struct {
		name, secret string
		body         []byte
		want         int
		ignored      bool
	}{
		{"bad signature", "wrong", issueComment(cloneURL, "@fleetbot x", "carol", "User", false), http.StatusUnauthorized, false},
		{"unknown repository", "hook-secret", other, http.StatusNotFound, false},
		{"unknown installation", "hook-secret", noInst, http.StatusNotFound, false},
		{"no mention", "hook-secret", issueComment(cloneURL, "fleetbot, x", "carol", "User", false), http.StatusAccepted, true},
		{"the app's own", "hook-secret", issueComment(cloneURL, "@fleetbot done", "fleetbot[bot]", "Bot", false), http.StatusAccepted, true},
		{"too large", "hook-secret", huge, http.StatusRequestEntityTooLarge, false},
	} {
		code, out := postGitHub(t, url, c.secret, "issue_comment", "d-"+c.name, c.body)
		require.Equal(t, c.want, code, "%s: %v", c.name, out)
		if c.ignored {
			require.NotEmpty(t, out["ignored"], c.name)
		}
	}
	ctx := t.Context()
	var lr protocol.APIReply
	fleettest.Eventually(t, wait, func() bool {
		var err error
		lr, err = f.Client.List(ctx, protocol.ListRequest{Tenant: "acme"})
		return err == nil && len(lr.Queries) > 0
	}, "acme's job in the list")
	require.Len(t, lr.Queries, 1, "nothing but the one job was queued")
	// Reported back: a link at the start, a draft pull request of the
	// pushed branch, and the outcome.
	fleettest.Eventually(t, wait, func() bool { return len(g.callsTo(http.MethodPost, "/repos/acme/widgets/issues/7/comments")) == 2 }, "two comments")
	comments := g.callsTo(http.MethodPost, "/repos/acme/widgets/issues/7/comments")
	require.Contains(t, comments[0].Body["body"], "https://fleet.example/q/acme/"+id)
	prs := g.callsTo(http.MethodPost, "/repos/acme/widgets/pulls")
	require.Len(t, prs, 1)
	require.Equal(t, true, prs[0].Body["draft"])
	require.Equal(t, "agentfleet/"+id, prs[0].Body["head"])
	require.Equal(t, "main", prs[0].Body["base"])
	end := comments[1].Body["body"].(string)
	for _, want := range []string{"succeeded", "**Files changed:** 1", "**Cost:** $", "https://github.example/acme/widgets/pull/10"} {
		require.Contains(t, end, want)
	}
	require.Equal(t, "Bearer "+token, comments[1].Auth, "reports use an installation token")
	// One token for the job, one per report (start, end); none for the
	// refused deliveries nor the redelivery; each scoped to the
	// repository and asked for with a JWT the fake verified.
	mints := g.callsTo(http.MethodPost, "/app/installations/42/")
	require.Len(t, mints, 3)
	for _, m := range mints {
		require.Equal(t, []any{"widgets"}, m.Body["repositories"], "the token is scoped to the repository")
		require.NoError(t, g.checkJWT(m.Auth))
	}
}

// TestGitHubReportFailureIsVisible: GitHub answering 5xx to the reports
// is retried, then kept on the repository's rule (tenant github ls); the
// job's own outcome is unaffected. A comment on a pull request works on
// the pull request's branch and pushes back to it.
func TestGitHubReportFailureIsVisible(t *testing.T) {
	t.Parallel()
	const token = "ghs_other7oken"
	f, g, repo, url, cloneURL := githubFleet(t, token, 10*time.Millisecond)
	rep := githubRequest(t, f, github.Request{Action: "add", Tenant: "acme", Repo: "acme/widgets", Rule: &github.Rule{
		Handle: "fleetbot", PromptTemplate: "/standin append=pr.txt commit=on_pr",
	}})
	require.Nil(t, rep.Error)
	code, out := postGitHub(t, url, "hook-secret", "issue_comment", "d-pr", issueComment(cloneURL, "@fleetbot fix it", "carol", "User", true))
	require.Equal(t, http.StatusAccepted, code, "%v", out)
	g.mu.Lock()
	g.fail5xx = true
	g.mu.Unlock()
	id := out["id"].(string)
	r := f.Follow("acme", id, wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, "feature", r.Final.Workspace.Branch)
	require.Equal(t, r.Final.Workspace.EndSHA, workspacetest.Git(t, repo.Bare, "rev-parse", "refs/heads/feature"), "pushed back to the pull request's branch")
	fleettest.Eventually(t, wait, func() bool {
		rep = githubRequest(t, f, github.Request{Action: "ls", Tenant: "acme"})
		return len(rep.Rules) == 1 && rep.Rules[0].LastError != ""
	}, "the report failure on the rule")
	require.Contains(t, rep.Rules[0].LastError, "502")
	require.Empty(t, g.callsTo(http.MethodPost, "/repos/acme/widgets/pulls"), "no pull request for a pull request's own branch")
	st, err := f.Client.Status(t.Context(), protocol.QueryRef{Tenant: "acme", ID: id})
	require.NoError(t, err)
	require.Equal(t, protocol.StateSucceeded, st.Status.State, "the job's outcome is its own")
}

// TestGitHubRuleCLI: tenant github add checks the rule (a bad template is
// refused, naming it), ls lists it, rm removes it.
func TestGitHubRuleCLI(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	url := f.Srv.ClientURL()
	bad := filepath.Join(t.TempDir(), "bad.tmpl")
	require.NoError(t, os.WriteFile(bad, []byte("Fix {{ .Nope }}"), 0o600))
	code, _, errOut := runCLI(t, url, "", "tenant", "github", "add", "acme", "--repo", "acme/widgets", "--handle", "fleetbot", "--prompt-template", bad)
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "prompt template")
	code, _, errOut = runCLI(t, url, "", "tenant", "github", "add", "acme", "--repo", "acme/widgets", "--handle", "fleetbot", "--label", "agent", "--assign")
	require.Equal(t, 0, code, errOut)
	code, _, _ = runCLI(t, url, "", "tenant", "github", "add", "other", "--repo", "ACME/widgets", "--label", "x")
	require.NotEqual(t, 0, code, "one rule per repository")
	code, out, errOut := runCLI(t, url, "", "tenant", "github", "ls")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "acme/widgets")
	require.Contains(t, out, "fleetbot")
	code, _, errOut = runCLI(t, url, "", "tenant", "github", "rm", "acme", "--repo", "acme/widgets")
	require.Equal(t, 0, code, errOut)
	code, out, _ = runCLI(t, url, "", "tenant", "github", "ls", "acme")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "acme/widgets")
}
