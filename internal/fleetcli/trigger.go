package fleetcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/trigger"
)

// triggerCmd is `dispatcher tenant trigger add|ls|rm`: a tenant's inbound
// webhook triggers, through fleet.api.trigger.
type triggerCmd struct {
	active   bool
	req      trigger.Request
	template string
	baseURL  string
}

// triggerHelp is added to tenant's help.
const triggerHelp = `
tenant trigger add TENANT NAME --template FILE [--url BASE] makes an inbound
webhook: it prints the URL to POST to (/v1/triggers/TENANT/NAME on the
dispatcher's --http address; --url BASE prints it whole) and its Standard
Webhooks secret (whsec_…, shown once). A POST signed with it starts the job
in FILE (a job in JSON whose strings may hold {{ .field }} placeholders,
filled from the body's top-level fields); a replay of the same webhook-id
starts nothing new. trigger ls [TENANT], trigger rm TENANT NAME.`

func (c *triggerCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.template, "template", "", "trigger add: the job template (JSON) file")
	fs.StringVar(&c.baseURL, "url", "", "trigger add: the dispatcher's public base URL, to print the trigger's URL whole")
}

func (c *triggerCmd) validate(fs *pflag.FlagSet) error {
	c.active = true
	c.req.Action = fs.Arg(1)
	want := map[string]int{"add": 4, "ls": 2, "rm": 4}[c.req.Action]
	if c.req.Action == "ls" && fs.NArg() == 3 {
		want = 3
	}
	if want == 0 {
		return fmt.Errorf("tenant trigger: want add, ls or rm, got %q", c.req.Action)
	}
	if fs.NArg() != want {
		return fmt.Errorf("tenant trigger %s: wrong number of arguments %q", c.req.Action, fs.Args()[2:])
	}
	if c.req.Action != "add" && (fs.Changed("template") || fs.Changed("url")) {
		return fmt.Errorf("--template and --url go with tenant trigger add only")
	}
	if fs.NArg() >= 3 {
		c.req.Tenant = fs.Arg(2)
		if err := validTenant(c.req.Tenant); err != nil {
			return err
		}
	}
	if fs.NArg() == 4 {
		c.req.Name = fs.Arg(3)
	}
	if c.req.Action == "add" {
		if c.template == "" {
			return fmt.Errorf("tenant trigger add: --template FILE is required")
		}
		b, err := os.ReadFile(c.template)
		if err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		if !json.Valid(b) {
			return fmt.Errorf("--template %s: not JSON", c.template)
		}
		c.req.Template = b
	}
	return nil
}

func (c *triggerCmd) run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	b, _ := json.Marshal(c.req)
	m, err := cl.NC.RequestWithContext(rctx, trigger.Subject(cl.Names), b)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	var rep trigger.Reply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		fmt.Fprintf(e.Err, "unreadable reply: %v\n", err)
		return ExitUnavailable
	}
	if rep.Error != nil {
		return replyError(e.Err, rep.Error)
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	defer func() { _ = tw.Flush() }()
	switch c.req.Action {
	case "add":
		t := rep.Triggers[0]
		fmt.Fprintf(tw, "url\t%s%s\nsecret\t%s\n", c.baseURL, t.Path, t.Secret)
		fmt.Fprintln(e.Err, "keep the secret: it signs every POST (Standard Webhooks), and is not shown again")
	case "rm":
		fmt.Fprintf(e.Err, "removed trigger %s/%s\n", c.req.Tenant, c.req.Name)
	default:
		fmt.Fprintln(tw, "TENANT\tNAME\tPATH\tCREATED")
		for _, t := range rep.Triggers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Tenant, t.Name, t.Path, t.Created)
		}
	}
	return ExitOK
}
