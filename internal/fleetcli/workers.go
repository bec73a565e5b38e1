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

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// workersCmd lists the workers that answer discovery.
type workersCmd struct{ asJSON bool }

func (c *workersCmd) Help() Help {
	return Help{
		Name: "workers", Summary: "list the workers (NATS micro discovery): state, slots, running jobs",
		Description: `Asks every worker registered as the micro service agentfleet-worker for its
info. States: pulling, waiting (not pulling yet: no work consumer), draining.`,
		Examples: "dispatcher workers\ndispatcher workers --json | jq '.[].running | length'",
	}
}

func (c *workersCmd) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.asJSON, "json", false, "print the workers' info as a JSON array")
}

func (c *workersCmd) Validate(fs *pflag.FlagSet) error {
	if fs.NArg() != 0 {
		return errors.New("workers takes no arguments")
	}
	return nil
}

func (c *workersCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	ws, err := cl.Workers(rctx)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if c.asJSON {
		if ws == nil {
			ws = []protocol.WorkerInfo{}
		}
		b, _ := json.MarshalIndent(ws, "", "  ")
		fmt.Fprintln(e.Out, string(b))
		return ExitOK
	}
	tw := tabwriter.NewWriter(e.Out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tSTATE\tSLOTS\tRUNNING\tUP\tVERSION\tJOBS")
	for _, w := range ws {
		var jobs []string
		for _, j := range w.Running {
			jobs = append(jobs, j.Tenant+"/"+j.ID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", w.ID, w.State, w.Slots, len(w.Running),
			time.Since(w.Started).Truncate(time.Second), w.Version, strings.Join(jobs, ","))
	}
	_ = tw.Flush()
	return ExitOK
}

// drainCmd drains one worker.
type drainCmd struct{ id string }

func (c *drainCmd) Help() Help {
	return Help{
		Name: "drain", Args: "<worker-id>",
		Summary: "drain a worker: it stops pulling, finishes or hands back its jobs, and exits",
		Description: `Sends the worker's drain request (micro service agentfleet-worker). The
worker stops taking jobs; running jobs keep heartbeating and may finish
within its --shutdown-grace, the rest are handed back to other workers; then
it exits 0. 'dispatcher workers' lists the ids.`,
		Examples: "dispatcher drain host-1-a2b3c4",
	}
}

func (c *drainCmd) Flags(*pflag.FlagSet) {}

func (c *drainCmd) Validate(fs *pflag.FlagSet) error {
	if fs.NArg() != 1 {
		return fmt.Errorf("want exactly one worker id, got %d arguments", fs.NArg())
	}
	c.id = fs.Arg(0)
	return nil
}

func (c *drainCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	info, err := cl.Drain(rctx, c.id)
	if errors.Is(err, fleetapi.ErrNotFound) {
		fmt.Fprintf(e.Err, "no worker %s answers\n", c.id)
		return ExitNotFound
	}
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	fmt.Fprintf(e.Err, "draining %s: %d running jobs get up to %s to finish\n", info.ID, len(info.Running), info.ShutdownGrace)
	return ExitOK
}
