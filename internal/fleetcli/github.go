package fleetcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/github"
)

// githubCmd is `dispatcher tenant github add|ls|rm`: the rules by which a
// GitHub App's events on a repository start a tenant's jobs, through
// fleet.api.github.
type githubCmd struct {
	active   bool
	req      github.Request
	rule     github.Rule
	template string
}

// githubHelp is added to tenant's help.
const githubHelp = `
tenant github add TENANT --repo OWNER/NAME [--handle NAME] [--label NAME]
[--assign] [--prompt-template FILE] [--base BRANCH] lets the GitHub App's
events on the repository start TENANT's jobs: a comment mentioning
@handle, an issue labeled --label, an issue assigned to the app (--assign).
github ls [TENANT] (with the last failure to report back to GitHub),
github rm TENANT --repo OWNER/NAME.`

func (c *githubCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.req.Repo, "repo", "", "github: the repository, OWNER/NAME")
	fs.StringVar(&c.rule.Handle, "handle", "", "github add: the app's login (without [bot]): comments mentioning @NAME start a job")
	fs.StringVar(&c.rule.Label, "label", "", "github add: an issue labeled NAME starts a job")
	fs.BoolVar(&c.rule.Assign, "assign", false, "github add: an issue assigned to the app (--handle) starts a job")
	fs.StringVar(&c.template, "prompt-template", "", "github add: the prompt, a text/template file over .Title .Body .Comment .URL .Repo .Number .Author")
	fs.StringVar(&c.rule.Base, "base", "", "github add: the branch the work starts from (default: the repository's default branch)")
}

func (c *githubCmd) validate(fs *pflag.FlagSet) error {
	c.active = true
	c.req.Action = fs.Arg(1)
	switch {
	case c.req.Action == "ls" && fs.NArg() <= 3:
	case (c.req.Action == "add" || c.req.Action == "rm") && fs.NArg() == 3:
	default:
		return fmt.Errorf("tenant github: want add TENANT --repo OWNER/NAME, ls [TENANT] or rm TENANT --repo OWNER/NAME, got %q", fs.Args()[1:])
	}
	if c.req.Action != "add" {
		for _, f := range []string{"handle", "label", "assign", "prompt-template", "base"} {
			if fs.Changed(f) {
				return fmt.Errorf("--%s goes with tenant github add only", f)
			}
		}
	}
	if fs.NArg() == 3 {
		c.req.Tenant = fs.Arg(2)
		if err := validTenant(c.req.Tenant); err != nil {
			return err
		}
	}
	if c.req.Action != "ls" && !github.ValidRepo(c.req.Repo) {
		return fmt.Errorf("tenant github %s: --repo OWNER/NAME is required, got %q", c.req.Action, c.req.Repo)
	}
	if c.req.Action == "add" {
		if c.template != "" {
			b, err := os.ReadFile(c.template)
			if err != nil {
				return fmt.Errorf("--prompt-template: %w", err)
			}
			c.rule.PromptTemplate = string(b)
		}
		c.req.Rule = &c.rule
	}
	return nil
}

func (c *githubCmd) run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	b, _ := json.Marshal(c.req)
	m, err := cl.NC.RequestWithContext(rctx, github.Subject(cl.Names), b)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	var rep github.Reply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		fmt.Fprintf(e.Err, "unreadable reply: %v\n", err)
		return ExitUnavailable
	}
	if rep.Error != nil {
		return replyError(e.Err, rep.Error)
	}
	switch c.req.Action {
	case "add":
		fmt.Fprintf(e.Err, "%s's events now start jobs of tenant %s\n", c.req.Repo, c.req.Tenant)
		return ExitOK
	case "rm":
		fmt.Fprintf(e.Err, "removed the rule of %s\n", c.req.Repo)
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	defer func() { _ = tw.Flush() }()
	fmt.Fprintln(tw, "TENANT\tREPO\tHANDLE\tLABEL\tASSIGN\tBASE\tLAST ERROR")
	for _, r := range rep.Rules {
		last := "-"
		if r.LastErrorAt != nil {
			last = r.LastErrorAt.Format("2006-01-02T15:04:05Z") + " " + r.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\n", r.Tenant, r.Repo, dash(r.Handle), dash(r.Label), r.Assign, dash(r.Base), last)
	}
	return ExitOK
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
