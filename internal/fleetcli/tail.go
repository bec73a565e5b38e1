package fleetcli

import (
	"context"

	"github.com/spf13/pflag"
)

// tailCmd replays a query from its first message, then follows it.
type tailCmd struct {
	tenant   string
	noFollow bool
	render   renderFlags
	id       string
}

func (c *tailCmd) Help() Help {
	return Help{
		Name: "tail", Args: "<id>",
		Summary: "replay a query from its first message, then follow it to its end",
		Description: `Renders everything the query's agent wrote so far, then follows it live
until it ends, and exits with the query's code (0 succeeded, 1 failed,
4 cancelled). An id with no messages and no status record is not found
(exit 3). While the query waits in the queue it says where it stands.
Ctrl-C stops following (exit 130); the query keeps running.`,
		Examples: `dispatcher tail q2 --tenant acme
dispatcher tail q2 --raw > q2.ndjson     # the stream's lines as they are (see --raw)
dispatcher tail q2 --no-follow           # what is there now, then exit (7 if still running)`,
	}
}

func (c *tailCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.BoolVar(&c.noFollow, "no-follow", false, "stop after the replay instead of following (exit 7 if the query has not ended)")
	c.render.add(fs)
}

func (c *tailCmd) Validate(fs *pflag.FlagSet) error {
	if err := oneID(fs, c.tenant); err != nil {
		return err
	}
	c.id = fs.Arg(0)
	return c.render.validate(true)
}

func (c *tailCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	return follow(ctx, e, cl, c.tenant, c.id, !c.noFollow, c.render, followHooks{})
}
