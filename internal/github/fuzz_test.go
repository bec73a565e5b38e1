package github

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// FuzzEventToJob: a webhook's payload is outside input. Whatever it holds,
// a job it maps to is the rule's tenant's, on the payload's clone URL,
// pushed to agentfleet/<id> (or a pull request's head), with the fleet's
// token and a github trigger; a bot's comment never maps to one.
func FuzzEventToJob(f *testing.F) {
	for _, c := range []struct{ typ, body string }{
		{"issue_comment", `{"action":"created","issue":{"number":7,"title":"t","body":"b","html_url":"https://github.com/o/r/issues/7"},"comment":{"body":"@bot go","user":{"login":"u"}},"repository":{"full_name":"o/r","clone_url":"https://github.com/o/r.git","default_branch":"main"},"sender":{"login":"u","type":"User"},"installation":{"id":1}}`},
		{"issues", `{"action":"labeled","label":{"name":"agent"},"issue":{"number":1,"title":"{{ .Title }}"},"repository":{"full_name":"o/r","clone_url":"https://github.com/o/r.git"},"sender":{"login":"u"},"installation":{"id":1}}`},
		{"issues", `{"action":"assigned","assignee":{"login":"bot[bot]"},"issue":{"number":1},"repository":{"full_name":"o/r","clone_url":"https://x@github.com/o/r.git"},"installation":{"id":1}}`},
		{"issue_comment", `{"action":"created","comment":{"body":"@bot"},"sender":{"login":"bot[bot]","type":"Bot"},"issue":{},"repository":{}}`},
		{"ping", `{}`},
	} {
		f.Add(c.typ, []byte(c.body), "")
	}
	rule := Rule{Tenant: "acme", Repo: "o/r", Handle: "bot", Label: "agent", Assign: true}
	f.Fuzz(func(t *testing.T, typ string, body []byte, head string) {
		ev, err := Parse(typ, body)
		if err != nil {
			return
		}
		if rule.Match(ev) != "" {
			return
		}
		if strings.EqualFold(ev.SenderType, "Bot") || strings.EqualFold(ev.SenderLogin, "bot[bot]") {
			t.Fatalf("a bot's event matched: %+v", ev)
		}
		job, err := rule.Job(ev, "delivery", head, "ghs_tok")
		if err != nil {
			return
		}
		if job.Tenant != "acme" || job.ID != JobID("delivery") || job.Workspace == nil || job.Workspace.Repo != ev.CloneURL ||
			!job.Workspace.Push || job.Workspace.Token != "ghs_tok" || job.Trigger == nil || job.Trigger.Kind != protocol.TriggerGitHub {
			t.Fatalf("job %+v", job)
		}
		if head == "" && job.Workspace.Branch != "agentfleet/"+job.ID || head != "" && job.Workspace.Branch != head {
			t.Fatalf("branch %q", job.Workspace.Branch)
		}
		if err := job.Validate("", true); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMentions(t *testing.T) {
	for text, want := range map[string]bool{
		"@bot go": true, "hi @Bot.": true, "(@bot)": true, "@bot[bot] x": true,
		"@bottle": false, "me@bot": false, "bot": false, "@bot-x": false,
	} {
		if Mentions(text, "bot") != want {
			t.Errorf("Mentions(%q) = %v", text, !want)
		}
	}
}
