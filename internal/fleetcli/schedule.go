package fleetcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/tenancy"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// scheduleCmd is `dispatcher schedule add|ls|rm|pause|resume`.
type scheduleCmd struct {
	job            submitCmd
	every, cron    string
	tz, at         string
	jsonOut        bool
	req            protocol.ScheduleRequest
	promptFromArgs []string
}

func (c *scheduleCmd) Help() Help {
	return Help{
		Name: "schedule", Args: "add|ls|rm|pause|resume [TENANT] …",
		Summary: "jobs submitted on a schedule: add, ls, rm, pause, resume",
		Description: `Keeps schedules in JetStream: nats-server itself fires each one (an interval,
a six-field cron "SEC MIN HOUR DOM MON DOW" with an optional time zone, or one
time), and the dispatcher submits its job with the id <NAME>-<fire time as
yyyymmddThhmmssZ>, admitted like any job. The job flags are submit's.
With a tenant's creds TENANT is implied and must be left out.

  schedule add TENANT NAME (--every D | --cron EXPR [--tz ZONE] | --at TIME) [job flags] [--] PROMPT
  schedule ls [TENANT] [--json]
  schedule rm TENANT NAME
  schedule pause|resume TENANT NAME`,
		Examples: `dispatcher schedule add acme nightly --cron "0 0 2 * * *" --tz Europe/Paris -- "Update the dependencies"
dispatcher schedule add acme poll --every 15m --repo https://git.example.com/app.git "Triage new issues"
dispatcher schedule ls acme
dispatcher schedule pause acme nightly
dispatcher --nats-creds acme.creds schedule ls --json`,
	}
}

func (c *scheduleCmd) Flags(fs *pflag.FlagSet) {
	c.job.Flags(fs)
	fs.StringVar(&c.every, "every", "", "add: fire every DURATION (at least 1s), counted from the add")
	fs.StringVar(&c.cron, "cron", "", `add: fire on a six-field cron "SEC MIN HOUR DOM MON DOW"`)
	fs.StringVar(&c.tz, "tz", "", "add: the cron's IANA time zone (default UTC)")
	fs.StringVar(&c.at, "at", "", "add: fire once at this RFC 3339 time")
	fs.BoolVar(&c.jsonOut, "json", false, "ls: print JSON objects (name, tenant, spec, next, last_job, …)")
}

// impliedTenant is the tenant of tenant creds given with --nats-creds.
func impliedTenant(fs *pflag.FlagSet) string {
	f := fs.Lookup("nats-creds")
	if f == nil || f.Value.String() == "" {
		return ""
	}
	ci, err := tenancy.ReadCreds(f.Value.String())
	if err != nil {
		return ""
	}
	return ci.Tenant
}

func (c *scheduleCmd) Validate(fs *pflag.FlagSet) error {
	args := fs.Args()
	if len(args) == 0 {
		return errors.New("want an action: add, ls, rm, pause or resume")
	}
	action, args := args[0], args[1:]
	c.req.Action = action
	implied := impliedTenant(fs)
	takeTenant := func(optional bool) error {
		if implied != "" {
			c.req.Tenant = implied
			return nil
		}
		if len(args) == 0 {
			if optional {
				return nil
			}
			return errors.New("want TENANT")
		}
		c.req.Tenant, args = args[0], args[1:]
		return validTenant(c.req.Tenant)
	}
	takeName := func() error {
		if len(args) == 0 {
			return errors.New("want NAME")
		}
		c.req.Name, args = args[0], args[1:]
		if !protocol.ValidScheduleName(c.req.Name) {
			return fmt.Errorf("name %q: must match %s", c.req.Name, protocol.ScheduleNamePattern)
		}
		return nil
	}
	switch action {
	case protocol.ScheduleList:
		if err := takeTenant(true); err != nil {
			return err
		}
	case protocol.ScheduleRemove, protocol.SchedulePause, protocol.ScheduleResume:
		if err := takeTenant(false); err != nil {
			return err
		}
		if err := takeName(); err != nil {
			return err
		}
	case protocol.ScheduleAdd:
		if err := takeTenant(false); err != nil {
			return err
		}
		if err := takeName(); err != nil {
			return err
		}
		return c.validateAdd(fs, args)
	default:
		return fmt.Errorf("unknown action %q: want add, ls, rm, pause or resume", action)
	}
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(args, " "))
	}
	return nil
}

func (c *scheduleCmd) validateAdd(fs *pflag.FlagSet, words []string) error {
	for _, f := range []string{"id", "follow"} {
		if fs.Changed(f) {
			return fmt.Errorf("--%s does not apply to a schedule (each firing gets its own id)", f)
		}
	}
	if fs.Changed("tenant") {
		return errors.New("--tenant: give the tenant as TENANT")
	}
	spec := protocol.ScheduleSpec{Every: c.every, Cron: c.cron, TZ: c.tz, At: c.at}
	if err := c.job.Validate(fs); err != nil {
		return err
	}
	c.job.job.ID, c.job.job.Tenant = "", ""
	c.promptFromArgs = words
	c.req.Spec = &spec
	return nil
}

func (c *scheduleCmd) Run(ctx context.Context, e *Env) int {
	if c.req.Action == protocol.ScheduleAdd {
		prompt, err := readPrompt(c.promptFromArgs, c.job.file, e.In)
		if err != nil {
			fmt.Fprintln(e.Err, err)
			return ExitUsage
		}
		job := c.job.job
		job.Prompt = prompt
		c.req.Job = &job
	}
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	r, err := cl.Schedule(rctx, c.req)
	cancel()
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		return replyError(e.Err, r.Error)
	}
	switch c.req.Action {
	case protocol.ScheduleRemove:
		fmt.Fprintf(e.Err, "removed schedule %s/%s\n", c.req.Tenant, c.req.Name)
		return ExitOK
	case protocol.ScheduleList:
		if c.jsonOut {
			if r.Schedules == nil {
				r.Schedules = []protocol.ScheduleInfo{}
			}
			b, _ := json.MarshalIndent(r.Schedules, "", "  ")
			fmt.Fprintln(e.Out, string(b))
			return ExitOK
		}
	}
	printSchedules(e, r.Schedules)
	return ExitOK
}

func printSchedules(e *Env, list []protocol.ScheduleInfo) {
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tNAME\tWHEN\tNEXT\tLAST JOB\tSTATE")
	for _, s := range list {
		next := "-"
		switch {
		case s.Paused:
			next = "paused"
		case s.Next != nil:
			next = s.Next.UTC().Format(time.RFC3339)
		}
		last, state := "-", "-"
		if s.LastJob != "" {
			last = s.LastJob
		}
		if s.LastState != "" {
			state = string(s.LastState)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Tenant, s.Name, s.Spec, next, last, state)
	}
	_ = tw.Flush()
}
