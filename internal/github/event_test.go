package github

import (
	"strings"
	"testing"
)

func issuesPayload(action, extra string) []byte {
	return []byte(`{"action":"` + action + `",` + extra + `"issue":{"number":3,"title":"T","body":"B","html_url":"https://github.com/o/r/issues/3","user":{"login":"carol"}},` +
		`"repository":{"full_name":"o/r","name":"r","owner":{"login":"o"},"clone_url":"https://github.com/o/r.git","default_branch":"trunk"},` +
		`"sender":{"login":"carol","type":"User"},"installation":{"id":5}}`)
}

// TestRuleMatchesIssuesEvents: a label starts a job only when it is the
// rule's, an assignment only to the app with --assign; other actions are
// not handled at all.
func TestRuleMatchesIssuesEvents(t *testing.T) {
	rule := Rule{Tenant: "acme", Repo: "o/r", Handle: "bot", Label: "agent", Assign: true, Base: "develop"}
	for _, c := range []struct {
		name, action, extra string
		rule                Rule
		starts              bool
	}{
		{"the rule's label", "labeled", `"label":{"name":"Agent"},`, rule, true},
		{"another label", "labeled", `"label":{"name":"bug"},`, rule, false},
		{"assigned to the app", "assigned", `"assignee":{"login":"bot[bot]"},`, rule, true},
		{"assigned to a person", "assigned", `"assignee":{"login":"dave"},`, rule, false},
		{"assign off", "assigned", `"assignee":{"login":"bot"},`, Rule{Tenant: "acme", Repo: "o/r", Handle: "bot"}, false},
	} {
		ev, err := Parse("issues", issuesPayload(c.action, c.extra))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		why := c.rule.Match(ev)
		if (why == "") != c.starts {
			t.Errorf("%s: match %q", c.name, why)
		}
		if why != "" {
			continue
		}
		job, err := c.rule.Job(ev, "dlv", "", "tok")
		if err != nil {
			t.Fatal(err)
		}
		if job.Workspace.Ref != "develop" || job.Trigger.Event != "issues."+c.action || !strings.Contains(job.Prompt, "T") ||
			job.Metadata[MetaBase] != "develop" || job.Metadata[MetaInstallation] != "5" {
			t.Errorf("%s: job %+v %+v", c.name, job, job.Workspace)
		}
	}
	if _, err := Parse("issues", issuesPayload("opened", "")); err == nil {
		t.Error("issues opened is handled")
	}
	if _, err := Parse("push", []byte(`{}`)); err == nil {
		t.Error("push is handled")
	}
}
