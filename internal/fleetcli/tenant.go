package fleetcli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// tenantCmd reads and writes tenant admission settings (KV FLEET_TENANTS).
type tenantCmd struct {
	sub, tenant string
	s           admission.Settings
	window      time.Duration
	changed     func(string) bool
	wh          webhookCmd
	trig        triggerCmd
	gh          githubCmd
}

func (c *tenantCmd) Help() Help {
	return Help{
		Name: "tenant", Args: "set|get|ls|rm|resume|webhook|trigger|github [<tenant>]",
		Summary: "admission settings of tenants: runs at once, fair-share weight, budget",
		Description: `Settings live in the KV bucket FLEET_TENANTS; a tenant without settings
gets the dispatcher's --tenant-max-running and --tenant-weight. set changes
only the flags given (0 puts a field back to the default). Writing needs the
dispatcher's NATS credentials (and --inbox-prefix _INBOX_dispatcher with the
shipped deploy/nats config): producers must not set their own caps.
get also shows what holds the tenant back now: its spend in the current
budget window, and a rate-limit pause with its end; resume ends a pause
at once (when a reset time was wrong, or the limit was lifted).` + webhookHelp + triggerHelp + githubHelp,
		Examples: `dispatcher tenant set acme --max-running 4 --weight 3
dispatcher tenant set acme --budget-usd 50 --budget-window 24h
dispatcher tenant get acme
dispatcher tenant ls
dispatcher tenant rm acme
dispatcher tenant resume acme              # end a rate-limit pause now`,
	}
}

func (c *tenantCmd) Flags(fs *pflag.FlagSet) {
	fs.IntVar(&c.s.MaxRunning, "max-running", 0, "set: most runs of this tenant at once (0: only the fleet's cap)")
	fs.Float64Var(&c.s.Weight, "weight", 0, "set: share of free slots under backlog (0: the default weight)")
	fs.Float64Var(&c.s.BudgetUSD, "budget-usd", 0, "set: stop admitting once results cost this much in a window (0: none)")
	fs.DurationVar(&c.window, "budget-window", 0, "set: the budget's window, e.g. 24h (aligned to multiples of it since the Unix epoch)")
	c.changed = fs.Changed
	c.wh.flags(fs)
	c.trig.flags(fs)
	c.gh.flags(fs)
}

func (c *tenantCmd) Validate(fs *pflag.FlagSet) error {
	c.sub = fs.Arg(0)
	if c.sub == "webhook" {
		return c.wh.validate(fs)
	}
	if c.sub == "trigger" {
		return c.trig.validate(fs)
	}
	if c.sub == "github" {
		return c.gh.validate(fs)
	}
	want := 2
	switch c.sub {
	case "set", "get", "rm", "resume":
	case "ls":
		want = 1
	default:
		return fmt.Errorf("tenant: want set, get, ls, rm or resume, got %q", c.sub)
	}
	if fs.NArg() != want {
		return fmt.Errorf("tenant %s takes %d argument(s), got %q", c.sub, want-1, fs.Args()[1:])
	}
	if c.sub != "set" {
		for _, f := range []string{"max-running", "weight", "budget-usd", "budget-window"} {
			if fs.Changed(f) {
				return fmt.Errorf("--%s goes with tenant set only", f)
			}
		}
	}
	if want == 2 {
		c.tenant = fs.Arg(1)
		return validTenant(c.tenant)
	}
	return nil
}

func (c *tenantCmd) Run(ctx context.Context, e *Env) int {
	if code, ok := c.runSub(ctx, e); ok {
		return code
	}
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	ts, err := admission.OpenTenants(rctx, cl.JS, cl.Names, false)
	if err != nil {
		fmt.Fprintf(e.Err, "%v (has `dispatcher serve` run on this NATS?)\n", err)
		return ExitUnavailable
	}
	switch c.sub {
	case "set":
		cur, err := ts.Get(rctx, c.tenant)
		if err != nil && !errors.Is(err, admission.ErrNoTenant) {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		if c.changed("max-running") {
			cur.MaxRunning = c.s.MaxRunning
		}
		if c.changed("weight") {
			cur.Weight = c.s.Weight
		}
		if c.changed("budget-usd") {
			cur.BudgetUSD = c.s.BudgetUSD
		}
		if c.changed("budget-window") {
			cur.BudgetWindow = admission.Duration(c.window)
		}
		if err := cur.Validate(); err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUsage
		}
		if err := ts.Set(rctx, c.tenant, cur); err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		printSettings(e, map[string]admission.Settings{c.tenant: cur}, []string{c.tenant})
	case "get":
		cur, err := ts.Get(rctx, c.tenant)
		none := errors.Is(err, admission.ErrNoTenant)
		if err != nil && !none {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		if !none {
			printSettings(e, map[string]admission.Settings{c.tenant: cur}, []string{c.tenant})
		}
		held, err := c.printHolds(rctx, e, cl.JS, cl.Names, cur)
		if err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		if none {
			fmt.Fprintf(e.Err, "tenant %s has no settings: the dispatcher's defaults apply\n", c.tenant)
			if !held {
				return ExitNotFound
			}
		}
	case "resume":
		st, err := admission.OpenState(rctx, cl.JS, cl.Names)
		if err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		resumed, err := st.Resume(rctx, c.tenant)
		if err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		if !resumed {
			fmt.Fprintf(e.Err, "tenant %s is not paused\n", c.tenant)
			return ExitOK
		}
		fmt.Fprintf(e.Err, "tenant %s resumed: its rate-limit pause is over\n", c.tenant)
	case "rm":
		if err := ts.Delete(rctx, c.tenant); err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
	case "ls":
		all, names, err := ts.List(rctx)
		if err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUnavailable
		}
		printSettings(e, all, names)
	}
	return ExitOK
}

// printHolds prints what holds the tenant back now (its budget window's
// spend, when it has a budget; a rate-limit pause) and reports whether
// there was anything to say.
func (c *tenantCmd) printHolds(ctx context.Context, e *Env, js jetstream.JetStream, names protocol.Names, s admission.Settings) (bool, error) {
	st, err := admission.OpenState(ctx, js, names)
	if err != nil {
		return false, err
	}
	now := time.Now()
	said := false
	if s.BudgetUSD > 0 && s.BudgetWindow > 0 {
		usd, start, err := st.Spent(ctx, c.tenant, time.Duration(s.BudgetWindow), now)
		if err != nil {
			return false, err
		}
		held := ""
		if usd >= s.BudgetUSD {
			held = " (budget reached: no new runs until the window ends)"
		}
		fmt.Fprintf(e.Out, "spent $%.4f of $%g in the window since %s%s\n", usd, s.BudgetUSD, start.Local().Format(time.DateTime), held)
		said = true
	}
	until, err := st.PausedUntil(ctx, c.tenant, now)
	if err != nil {
		return false, err
	}
	if !until.IsZero() {
		fmt.Fprintf(e.Out, "paused (rate limited) until %s: no new runs until then; `dispatcher tenant resume %s` ends it now\n", until.Local().Format(time.DateTime), c.tenant)
		said = true
	}
	return said, nil
}

func printSettings(e *Env, all map[string]admission.Settings, names []string) {
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMAX_RUNNING\tWEIGHT\tBUDGET_USD\tBUDGET_WINDOW")
	or := func(v, def string, set bool) string {
		if set {
			return v
		}
		return def
	}
	for _, n := range names {
		s := all[n]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n,
			or(strconv.Itoa(s.MaxRunning), "default", s.MaxRunning > 0),
			or(strconv.FormatFloat(s.Weight, 'g', -1, 64), "default", s.Weight > 0),
			or(strconv.FormatFloat(s.BudgetUSD, 'g', -1, 64), "-", s.BudgetUSD > 0),
			or(time.Duration(s.BudgetWindow).String(), "-", s.BudgetWindow > 0))
	}
	_ = tw.Flush()
}

// runSub runs the webhook, trigger or github subcommand, if one was given.
func (c *tenantCmd) runSub(ctx context.Context, e *Env) (int, bool) {
	switch {
	case c.wh.active:
		return c.wh.run(ctx, e), true
	case c.trig.active:
		return c.trig.run(ctx, e), true
	case c.gh.active:
		return c.gh.run(ctx, e), true
	}
	return 0, false
}
