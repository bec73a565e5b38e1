package github

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	gh "github.com/google/go-github/v89/github"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Durable is the Reporter's consumer on the queries stream's statuses.
const Durable = "dispatcher-github"

// DefaultBackoff is how long the Reporter waits before each retry of a
// report GitHub did not take (unreachable, 5xx, rate limited).
var DefaultBackoff = []time.Duration{2 * time.Second, 10 * time.Second, time.Minute, 5 * time.Minute}

// maxResult bounds the result text quoted in the closing comment.
const maxResult = 4000

// Reporter follows the statuses of the jobs GitHub events started and
// posts back on their issue or pull request: a comment with a link to the
// run at "running", a comment with the outcome at the end, and a draft
// pull request for a pushed branch (none when the job worked on a pull
// request's own branch: the push updated it). A report GitHub does not
// take is retried with Backoff; after the last try the failure is kept on
// the repository's rule (tenant github ls) and the job is left as it is.
type Reporter struct {
	App       *App
	Rules     *Store
	JS        jetstream.JetStream
	Names     protocol.Names
	PublicURL string
	Log       zerolog.Logger
	Backoff   []time.Duration // nil = DefaultBackoff
	cc        jetstream.ConsumeContext
}

// Start creates the durable consumer and consumes.
func (r *Reporter) Start(ctx context.Context) error {
	if r.Backoff == nil {
		r.Backoff = DefaultBackoff
	}
	c, err := provision.Consumer(ctx, r.JS, r.Names.QueriesStream(), jetstream.ConsumerConfig{
		Durable: Durable, FilterSubject: r.Names.StatusWildcard(), AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy, AckWait: 2 * time.Minute, MaxDeliver: len(r.Backoff) + 1, MaxAckPending: 64,
	})
	if err != nil {
		return fmt.Errorf("github: the reporter's consumer: %w", err)
	}
	r.cc, err = c.Consume(r.handle)
	return err
}

// Stop stops consuming; a report under way finishes or is redelivered.
func (r *Reporter) Stop(context.Context) error {
	if r.cc != nil {
		r.cc.Drain()
		<-r.cc.Closed()
		r.cc = nil
	}
	return nil
}

func (r *Reporter) handle(m jetstream.Msg) {
	var ev protocol.StatusEvent
	if json.Unmarshal(m.Data(), &ev) != nil || ev.Trigger == nil || ev.Trigger.Kind != protocol.TriggerGitHub ||
		!(ev.State == protocol.StateRunning && ev.Attempt <= 1 || ev.State.Terminal()) {
		_ = m.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := r.report(ctx, ev)
	if err == nil {
		_ = m.Ack()
		return
	}
	md, _ := m.Metadata()
	code := StatusCode(err)
	transient := code == 0 || code >= 500 || code == http.StatusTooManyRequests
	if transient && md != nil && int(md.NumDelivered) <= len(r.Backoff) {
		r.Log.Warn().Err(err).Str("query_id", ev.ID).Uint64("try", md.NumDelivered).Msg("reporting to GitHub; retrying")
		_ = m.NakWithDelay(r.Backoff[md.NumDelivered-1])
		return
	}
	msg := fmt.Sprintf("reporting %s/%s (%s) to GitHub: %v", ev.Tenant, ev.ID, ev.State, err)
	r.Log.Error().Str("query_id", ev.ID).Msg(msg)
	if repo := ev.Metadata[MetaRepo]; repo != "" {
		if rerr := r.Rules.RecordFailure(ctx, repo, msg); rerr != nil {
			r.Log.Warn().Err(rerr).Msg("keeping the report failure on the rule")
		}
	}
	_ = m.Term()
}

// report posts ev's news on its issue or pull request.
func (r *Reporter) report(ctx context.Context, ev protocol.StatusEvent) error {
	repo := ev.Metadata[MetaRepo]
	owner, name, _ := strings.Cut(repo, "/")
	number, _ := strconv.Atoi(ev.Metadata[MetaNumber])
	inst, _ := strconv.ParseInt(ev.Metadata[MetaInstallation], 10, 64)
	if owner == "" || name == "" || number <= 0 || inst <= 0 {
		r.Log.Warn().Str("query_id", ev.ID).Msg("a GitHub job without its github.* metadata: nothing reported")
		return nil
	}
	token, err := r.App.Token(ctx, inst, name)
	if err != nil {
		return err
	}
	c := r.App.As(token)
	link := strings.TrimSuffix(r.PublicURL, "/") + "/q/" + ev.Tenant + "/" + ev.ID
	if ev.State == protocol.StateRunning {
		return r.comment(ctx, c, owner, name, number, fmt.Sprintf("Working on it: [%s](%s)", ev.ID, link))
	}
	var pr string
	ws := ev.Workspace
	if ev.State == protocol.StateSucceeded && ws != nil && ws.Pushed && ev.Metadata[MetaPR] != "true" {
		p, _, err := c.PullRequests.Create(ctx, owner, name, &gh.NewPullRequest{
			Title: gh.Ptr(fmt.Sprintf("agentfleet: #%d", number)), Head: gh.Ptr(ws.Branch), Base: gh.Ptr(ev.Metadata[MetaBase]),
			Body: gh.Ptr(fmt.Sprintf("For #%d, by run [%s](%s).", number, ev.ID, link)), Draft: gh.Ptr(true),
		})
		switch {
		case err == nil:
			pr = p.GetHTMLURL()
		case StatusCode(err) != http.StatusUnprocessableEntity: // 422: it exists (a retry)
			return err
		}
	}
	return r.comment(ctx, c, owner, name, number, r.outcome(ctx, ev, link, pr))
}

func (r *Reporter) comment(ctx context.Context, c *gh.Client, owner, name string, number int, body string) error {
	_, _, err := c.Issues.CreateComment(ctx, owner, name, number, &gh.IssueComment{Body: gh.Ptr(body)})
	return err
}

// outcome is the closing comment: the state, the result text (cut), the
// files changed, the cost, the failure's reason, the pull request.
func (r *Reporter) outcome(ctx context.Context, ev protocol.StatusEvent, link, pr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run [%s](%s) %s.\n", ev.ID, link, ev.State)
	if ev.Error != nil {
		fmt.Fprintf(&b, "\n**Why:** %s\n", ev.Error.Message)
	}
	if text := r.resultText(ctx, ev); text != "" {
		fmt.Fprintf(&b, "\n%s\n", text)
	}
	if ws := ev.Workspace; ws != nil {
		fmt.Fprintf(&b, "\n**Files changed:** %d (+%d −%d)", ws.FilesChanged, ws.Additions, ws.Deletions)
		if ws.Pushed {
			fmt.Fprintf(&b, " on `%s`", ws.Branch)
		}
		if ws.PushError != "" {
			fmt.Fprintf(&b, " (push failed: %s)", ws.PushError)
		}
		b.WriteString("\n")
	}
	if res := ev.Result; res != nil {
		fmt.Fprintf(&b, "**Cost:** $%.4f\n", res.TotalCostUSD)
		if res.IsError && len(res.Errors) > 0 {
			fmt.Fprintf(&b, "**Errors:** %s\n", strings.Join(res.Errors, "; "))
		}
	}
	if pr != "" {
		fmt.Fprintf(&b, "**Draft pull request:** %s\n", pr)
	}
	return b.String()
}

// resultText is the result line's text, from the query's last message.
func (r *Reporter) resultText(ctx context.Context, ev protocol.StatusEvent) string {
	st, err := r.JS.Stream(ctx, r.Names.QueriesStream())
	if err != nil {
		return ""
	}
	m, err := st.GetLastMsgForSubject(ctx, r.Names.QueryMsg(ev.Tenant, ev.ID))
	if err != nil {
		return ""
	}
	var line struct {
		Type   string `json:"type"`
		Result string `json:"result"`
	}
	if json.Unmarshal(m.Data, &line) != nil || line.Type != "result" {
		return ""
	}
	if len(line.Result) > maxResult {
		return strings.ToValidUTF8(line.Result[:maxResult], "") + "\n\n[… cut]"
	}
	return line.Result
}
