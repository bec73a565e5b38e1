package fleetcli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/render"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// statusCmd prints a query's status.
type statusCmd struct {
	tenant string
	asJSON bool
	id     string
}

func (c *statusCmd) Help() Help {
	return Help{
		Name: "status", Args: "<id>",
		Summary: "print a query's status (JSON, or a summary with --json=false)",
		Description: `Prints the query's latest status event. The exit code is its state's:
0 succeeded, 1 failed, 4 cancelled, 6 rejected as invalid, 7 not ended yet
(queued, running, retrying), 3 no such query.`,
		Examples: `dispatcher status q2 --tenant acme
dispatcher status q2 --json=false
dispatcher status q2 | jq -r .result.total_cost_usd`,
	}
}

func (c *statusCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.BoolVar(&c.asJSON, "json", true, "print the status event as JSON; --json=false prints a summary for people")
}

func (c *statusCmd) Validate(fs *pflag.FlagSet) error {
	if err := oneID(fs, c.tenant); err != nil {
		return err
	}
	c.id = fs.Arg(0)
	return nil
}

func (c *statusCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	r, err := cl.Status(rctx, protocol.QueryRef{ID: c.id, Tenant: c.tenant})
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		return replyError(e.Err, r.Error)
	}
	if c.asJSON {
		b, _ := json.MarshalIndent(r.Status, "", "  ")
		fmt.Fprintln(e.Out, string(b))
	} else {
		summary(e.Out, r.Status)
	}
	return stateExit(r.Status)
}

// summary prints a status event for people.
func summary(w io.Writer, ev *protocol.StatusEvent) {
	fmt.Fprintf(w, "%s/%s: %s", ev.Tenant, ev.ID, ev.State)
	if ev.Attempt > 0 {
		fmt.Fprintf(w, " · attempt %d", ev.Attempt)
	}
	if ev.Worker != "" {
		fmt.Fprintf(w, " · worker %s", ev.Worker)
	}
	fmt.Fprintf(w, " · at %s\n", ev.At.Local().Format(time.DateTime))
	if r := ev.Result; r != nil {
		// A session's status says its turn (a parked one's result holds
		// no turn count of its own).
		fmt.Fprintf(w, "result: %s · turns %d · cost $%.4f · %s\n", cmpStr(r.Subtype, "-"), max(r.NumTurns, ev.Turn), r.TotalCostUSD, duration(r.DurationMS))
	}
	if ev.Error != nil {
		fmt.Fprintf(w, "error: %s: %s\n", ev.Error.Code, ev.Error.Message)
	}
	if ev.Result != nil && ev.Result.StderrTail != "" {
		(&render.Printer{W: w}).StderrTail(ev.Result.StderrTail)
	}
	if ws := ev.Workspace; ws != nil && ws.EndSHA != "" {
		asOf := ""
		if ws.Checkpoint {
			asOf = " (as of the last checkpoint)"
		}
		fmt.Fprintf(w, "workspace%s: %s · %d files · +%d −%d · %s\n", asOf, ws.Branch, ws.FilesChanged, ws.Additions, ws.Deletions, ws.EndSHA)
	}
	for k, v := range ev.Metadata {
		fmt.Fprintf(w, "meta %s=%s\n", k, v)
	}
}

func cmpStr(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func duration(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}
