package fleetcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// states are the states ls --state accepts.
var states = []protocol.State{
	protocol.StateQueued, protocol.StateRunning, protocol.StateRetrying,
	protocol.StateSucceeded, protocol.StateFailed, protocol.StateCancelled,
}

// lsCmd lists recent queries.
type lsCmd struct {
	tenant     string
	allTenants bool
	state      string
	limit      int
	asJSON     bool
	dlq        bool
}

func (c *lsCmd) Help() Help {
	return Help{
		Name: "ls", Args: "",
		Summary: "list recent queries of a tenant (or of all tenants with -A)",
		Description: `Lists the newest queries first with their state, attempt, worker, run
duration, cost and error code; WAITING says why a queued query waits
(fleet_cap, tenant_cap, budget, rate_limited) and its place in its
tenant's queue (#1 = next). --json prints the status events as a JSON
array instead.

--dlq lists the dead-letter stream instead, newest first: jobs a worker
terminated as invalid (reason invalid_job; a body that is not JSON or has no
id is only here) and jobs redelivered too often (max_deliveries), with the
reason in words and the start of the body. --json prints them as JSON.`,
		Examples: `dispatcher ls
dispatcher ls --tenant acme --state failed
dispatcher ls -A --limit 200 --json | jq -r '.[] | select(.state=="running") | .id'
dispatcher ls --dlq -A        # dead letters: jobs no worker could read or finish, with why`,
	}
}

func (c *lsCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.BoolVarP(&c.allTenants, "all-tenants", "A", false, "every tenant's queries (--tenant is ignored)")
	fs.StringVar(&c.state, "state", "", "only queries in this state: queued, running, retrying, succeeded, failed, cancelled")
	fs.IntVar(&c.limit, "limit", 50, "at most this many (1-1000)")
	fs.BoolVar(&c.asJSON, "json", false, "print the status events as a JSON array")
	fs.BoolVar(&c.dlq, "dlq", false, "list dead letters (invalid or undeliverable jobs) instead of queries")
}

func (c *lsCmd) Validate(fs *pflag.FlagSet) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("ls takes no arguments, got %q", fs.Args())
	}
	if c.allTenants && fs.Changed("tenant") {
		return errors.New("give --tenant or --all-tenants, not both")
	}
	if !c.allTenants {
		if err := validTenant(c.tenant); err != nil {
			return err
		}
	}
	if c.dlq && c.state != "" {
		return errors.New("--state does not apply to --dlq")
	}
	if c.state != "" && !slices.Contains(states, protocol.State(c.state)) {
		return fmt.Errorf("--state %q: want one of %v", c.state, states)
	}
	if c.limit < 1 || c.limit > 1000 {
		return fmt.Errorf("--limit %d: want 1 to 1000", c.limit)
	}
	return nil
}

func (c *lsCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	req := protocol.ListRequest{State: protocol.State(c.state), Limit: c.limit, DeadLetters: c.dlq}
	if !c.allTenants {
		req.Tenant = c.tenant
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	r, err := cl.List(rctx, req)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		return replyError(e.Err, r.Error)
	}
	if c.dlq {
		return printDeadLetters(e, r.DeadLetters, c.asJSON)
	}
	if c.asJSON {
		qs := r.Queries
		if qs == nil {
			qs = []protocol.StatusEvent{}
		}
		b, _ := json.MarshalIndent(qs, "", "  ")
		fmt.Fprintln(e.Out, string(b))
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tID\tSTATE\tATTEMPT\tWORKER\tDURATION\tCOST\tAT\tERROR\tWAITING")
	for _, q := range r.Queries {
		errCode, dur, cost := "", "-", "-"
		if q.Error != nil {
			errCode = q.Error.Code
		}
		if q.Result != nil {
			dur = duration(q.Result.DurationMS)
			cost = fmt.Sprintf("$%.4f", q.Result.TotalCostUSD)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", q.Tenant, q.ID, q.State, q.Attempt, cmpStr(q.Worker, "-"),
			dur, cost, q.At.Local().Format(time.DateTime), errCode, waiting(q))
	}
	_ = tw.Flush()
	return ExitOK
}

// printDeadLetters prints ls --dlq.
func printDeadLetters(e *Env, dls []protocol.DeadLetter, asJSON bool) int {
	if asJSON {
		if dls == nil {
			dls = []protocol.DeadLetter{}
		}
		b, _ := json.MarshalIndent(dls, "", "  ")
		fmt.Fprintln(e.Out, string(b))
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTENANT\tID\tAT\tREASON\tERROR\tBODY")
	for _, d := range dls {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Seq, d.Tenant, cmpStr(d.ID, "-"), d.At.Local().Format(time.DateTime),
			d.Reason, oneLine(cmpStr(d.Error, "-"), 120), oneLine(strconv.Quote(string(d.Body)), 60))
	}
	_ = tw.Flush()
	return ExitOK
}

// oneLine shortens s to at most n runes on one line.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// waiting says why a queued query waits and where it is in its tenant's
// queue ("tenant_cap #3"), or "" when not known.
func waiting(q protocol.StatusEvent) string {
	if q.State != protocol.StateQueued || q.Reason == "" {
		return ""
	}
	if q.Position > 0 {
		return q.Reason + " #" + strconv.Itoa(q.Position)
	}
	return q.Reason
}
