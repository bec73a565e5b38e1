package fleetcli

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// cancelCmd cancels a queued or running query.
type cancelCmd struct {
	tenant string
	id     string
}

func (c *cancelCmd) Help() Help {
	return Help{
		Name: "cancel", Args: "<id>",
		Summary: "cancel a running or queued query",
		Description: `Asks the worker running the query to stop it (a queued query is never
started). Exits 0 once the cancel is requested, or when the query had
already ended (it says how); 3 when there is no such query. Follow it with
'dispatcher tail <id>' to see it end.`,
		Examples: `dispatcher cancel q2 --tenant acme`,
	}
}

func (c *cancelCmd) Flags(fs *pflag.FlagSet) { addTenant(fs, &c.tenant) }

func (c *cancelCmd) Validate(fs *pflag.FlagSet) error {
	if err := oneID(fs, c.tenant); err != nil {
		return err
	}
	c.id = fs.Arg(0)
	return nil
}

func (c *cancelCmd) Run(ctx context.Context, e *Env) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	ref := protocol.QueryRef{ID: c.id, Tenant: c.tenant}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	// A person typing an unknown id wants to hear so. But a job published
	// straight to the queue has no status until it is held back or a
	// worker takes it, so the cancel is sent anyway (the dispatcher records
	// it; it applies to a submission made before it, never to a later one).
	st, err := cl.Status(rctx, ref)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if st.Error != nil && st.Error.Code != protocol.CodeNotFound {
		return replyError(e.Err, st.Error)
	}
	unknown := st.Error != nil
	r, err := cl.Cancel(rctx, ref)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		if r.Error.Code == codeAlreadyFinished {
			fmt.Fprintf(e.Err, "%s/%s already ended: %s\n", ref.Tenant, ref.ID, r.Error.Message)
			return ExitOK
		}
		return replyError(e.Err, r.Error)
	}
	if r.Status != nil && r.Status.State == protocol.StateCancelled {
		was := "it was still queued"
		if st.Status != nil && st.Status.State == protocol.StateParked {
			was = "the session was parked"
		}
		fmt.Fprintf(e.Err, "%s/%s cancelled (%s)\n", ref.Tenant, ref.ID, was)
		return ExitOK
	}
	if unknown {
		fmt.Fprintf(e.Err, "no query %s/%s on record; the cancel is recorded anyway: a job of that id published straight to the queue (it has no status until a worker takes it) will not start\n", ref.Tenant, ref.ID)
		return ExitNotFound
	}
	fmt.Fprintf(e.Err, "cancel requested for %s/%s\n", ref.Tenant, ref.ID)
	return ExitOK
}

// codeAlreadyFinished is the dispatcher's error code for a cancel of a query
// that already ended.
const codeAlreadyFinished = "already_finished"
