package github

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	gh "github.com/google/go-github/v89/github"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ErrUnhandled is an event of a type or action no rule acts on.
var ErrUnhandled = errors.New("event not handled")

// Event is what the fleet takes from a webhook's payload.
type Event struct {
	// Type and Action: "issue_comment" "created", "issues" "labeled"…
	Type, Action string
	// Repo is "owner/name"; CloneURL and DefaultBranch as the API reports.
	Repo, Owner, Name       string
	CloneURL, DefaultBranch string
	Installation            int64
	Number                  int
	Title, Body, URL        string
	// Comment is the comment's text (issue_comment); Author wrote the
	// comment, or the issue for issues events.
	Comment, Author string
	// PR: the issue is a pull request.
	PR                      bool
	SenderLogin, SenderType string
	Label, Assignee         string
}

// Parse decodes a webhook's payload (go-github's ParseWebHook) into an
// Event; ErrUnhandled for event types and actions no rule acts on.
func Parse(eventType string, payload []byte) (*Event, error) {
	raw, err := gh.ParseWebHook(eventType, payload)
	if err != nil {
		if strings.Contains(err.Error(), "unknown X-Github-Event") {
			return nil, fmt.Errorf("%w: %q events", ErrUnhandled, eventType)
		}
		return nil, err
	}
	ev := &Event{Type: eventType}
	var issue *gh.Issue
	var repo *gh.Repository
	var sender *gh.User
	var inst *gh.Installation
	switch e := raw.(type) {
	case *gh.IssueCommentEvent:
		ev.Action, issue, repo, sender, inst = e.GetAction(), e.Issue, e.Repo, e.Sender, e.Installation
		if ev.Action != "created" {
			return nil, fmt.Errorf("%w: issue_comment %q (only created)", ErrUnhandled, ev.Action)
		}
		ev.Comment, ev.Author = e.GetComment().GetBody(), e.GetComment().GetUser().GetLogin()
	case *gh.IssuesEvent:
		ev.Action, issue, repo, sender, inst = e.GetAction(), e.Issue, e.Repo, e.Sender, e.Installation
		if ev.Action != "labeled" && ev.Action != "assigned" {
			return nil, fmt.Errorf("%w: issues %q (only labeled and assigned)", ErrUnhandled, ev.Action)
		}
		ev.Label, ev.Assignee, ev.Author = e.GetLabel().GetName(), e.GetAssignee().GetLogin(), issue.GetUser().GetLogin()
	default:
		return nil, fmt.Errorf("%w: %q events", ErrUnhandled, eventType)
	}
	if issue == nil || repo == nil {
		return nil, errors.New("the payload has no issue or repository")
	}
	ev.Repo, ev.Owner, ev.Name = repo.GetFullName(), repo.GetOwner().GetLogin(), repo.GetName()
	if ev.Owner == "" || ev.Name == "" {
		ev.Owner, ev.Name, _ = strings.Cut(ev.Repo, "/")
	}
	ev.CloneURL, ev.DefaultBranch = repo.GetCloneURL(), repo.GetDefaultBranch()
	ev.Installation = inst.GetID()
	ev.Number, ev.Title, ev.Body, ev.URL = issue.GetNumber(), issue.GetTitle(), issue.GetBody(), issue.GetHTMLURL()
	ev.PR = issue.PullRequestLinks != nil
	ev.SenderLogin, ev.SenderType = sender.GetLogin(), sender.GetType()
	return ev, nil
}

// Kind is the event as a trigger names it: "issue_comment",
// "issues.labeled", "issues.assigned".
func (ev *Event) Kind() string {
	if ev.Type == "issue_comment" {
		return ev.Type
	}
	return ev.Type + "." + ev.Action
}

// Match says why r starts no job for ev ("" when it does).
func (r Rule) Match(ev *Event) string {
	bot := strings.EqualFold(ev.SenderType, "Bot") ||
		(r.Handle != "" && strings.EqualFold(ev.SenderLogin, r.Handle+"[bot]"))
	switch {
	case bot:
		return "sent by a bot (" + ev.SenderLogin + "): the app does not answer itself"
	case ev.Type == "issue_comment":
		if r.Handle == "" {
			return "the repository's rule has no handle: comments start nothing"
		}
		if !Mentions(ev.Comment, r.Handle) {
			return "the comment does not mention @" + r.Handle
		}
	case ev.Action == "labeled":
		if r.Label == "" || !strings.EqualFold(ev.Label, r.Label) {
			return "the label " + strconv.Quote(ev.Label) + " is not the rule's"
		}
		if ev.PR {
			return "a labeled pull request (labels start work on issues)"
		}
	case ev.Action == "assigned":
		if !r.Assign || !(strings.EqualFold(ev.Assignee, r.Handle) || strings.EqualFold(ev.Assignee, r.Handle+"[bot]")) {
			return "assigned to " + ev.Assignee + ", not to the app (or the rule has no --assign)"
		}
		if ev.PR {
			return "an assigned pull request (assignment starts work on issues)"
		}
	default:
		return "event not handled"
	}
	return ""
}

// Mentions reports whether text mentions @handle (case-insensitive, as a
// whole login).
func Mentions(text, handle string) bool {
	re := regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_/-])@` + regexp.QuoteMeta(handle) + `(\[bot\])?($|[^A-Za-z0-9_-])`)
	return re.MatchString(text)
}

// JobID is the id of the job delivery starts: the same for every
// redelivery of it.
func JobID(delivery string) string {
	sum := sha256.Sum256([]byte(delivery))
	return "gh-" + hex.EncodeToString(sum[:8])
}

// Metadata keys of the jobs GitHub events start, which the Reporter reads
// back from their statuses.
const (
	MetaRepo         = "github.repo"
	MetaNumber       = "github.number"
	MetaInstallation = "github.installation"
	MetaPR           = "github.pr"
	MetaBase         = "github.base"
)

// maxText bounds the issue's and the comment's text in a prompt.
const maxText = 64 << 10

func clip(s string) string {
	if len(s) <= maxText {
		return s
	}
	return strings.ToValidUTF8(s[:maxText], "") + "\n[… cut]"
}

// Job builds the job ev starts under rule r: a workspace run on the
// repository's clone URL, starting at ref (the rule's base, the default
// branch, or the pull request's head branch prHead, whose branch the work
// is pushed back to), with token for its fetch and push.
func (r Rule) Job(ev *Event, delivery, prHead, token string) (*protocol.Job, error) {
	prompt, err := r.Prompt(PromptData{Title: clip(ev.Title), Body: clip(ev.Body), Comment: clip(ev.Comment), URL: ev.URL,
		Repo: ev.Repo, Author: ev.Author, Number: ev.Number})
	if err != nil {
		return nil, err
	}
	id := JobID(delivery)
	ws := &protocol.Workspace{Repo: ev.CloneURL, Ref: r.Base, Branch: "agentfleet/" + id, Push: true, Token: token}
	if ws.Ref == "" {
		ws.Ref = ev.DefaultBranch
	}
	base := ws.Ref
	if prHead != "" {
		ws.Ref, ws.Branch = prHead, prHead
	}
	job := &protocol.Job{ID: id, Tenant: r.Tenant, Prompt: prompt, Workspace: ws,
		Trigger: &protocol.Trigger{Kind: protocol.TriggerGitHub, Event: ev.Kind(), Delivery: delivery, URL: ev.URL},
		Metadata: map[string]string{MetaRepo: ev.Repo, MetaNumber: strconv.Itoa(ev.Number),
			MetaInstallation: strconv.FormatInt(ev.Installation, 10), MetaBase: base}}
	if prHead != "" {
		job.Metadata[MetaPR] = "true"
	}
	if err := job.Validate("", true); err != nil {
		return nil, err
	}
	return job, nil
}
