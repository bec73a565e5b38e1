package fleetcli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// sessionOp sends one session op through the dispatcher and reports it.
func sessionOp(ctx context.Context, e *Env, op string, req protocol.SessionOpRequest) int {
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	defer cancel()
	ref := protocol.QueryRef{ID: req.ID, Tenant: req.Tenant}
	if st, err := cl.Status(rctx, ref); err == nil && st.Error == nil && notSession(st.Status) {
		fmt.Fprintf(e.Err, "%s/%s is not a session (a one-shot query takes no %s); nothing sent\n", cmpTenant(req.Tenant), req.ID, op)
		return ExitUsage
	}
	r, err := cl.SessionOp(rctx, op, req)
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		return replyError(e.Err, r.Error)
	}
	fmt.Fprintf(e.Err, "%s sent to %s/%s\n", op, cmpTenant(req.Tenant), req.ID)
	return ExitOK
}

// notSession reports whether st, a query's last status, is a one-shot
// query's: a worker marks every status of a session job "session":true,
// and idle, parked and awaiting_approval are states only a session has
// (statuses of workers from before the mark). A queued status, the
// dispatcher's, says nothing either way.
func notSession(st *protocol.StatusEvent) bool {
	if st == nil || st.Session || st.Worker == "" {
		return false
	}
	switch st.State {
	case protocol.StateIdle, protocol.StateParked, protocol.StateAwaitingApproval, protocol.StateQueued:
		return false
	}
	return true
}

func cmpTenant(t string) string {
	if t == "" {
		return protocol.DefaultTenant
	}
	return t
}

// sendCmd sends one input to a session.
type sendCmd struct {
	tenant, id, text, uuid string
	interrupt, end         bool
}

func (c *sendCmd) Help() Help {
	return Help{
		Name: "send", Args: `<id> "text"`,
		Summary: "send an input to a session (or --interrupt, --end)",
		Description: `Sends one user turn to a session query. Inputs run in the order they were
sent, each once: while a turn runs they wait; a parked session is resumed
on any worker. --interrupt ends the running turn (the session stays);
--end ends the session after its current turn.`,
		Examples: `dispatcher send s1 "now add tests"
dispatcher send s1 --interrupt
dispatcher send s1 --end`,
	}
}

func (c *sendCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.StringVar(&c.uuid, "uuid", "", "name the input (its stream-json uuid)")
	fs.BoolVar(&c.interrupt, "interrupt", false, "interrupt the running turn instead of sending text")
	fs.BoolVar(&c.end, "end", false, "end the session after its current turn")
}

func (c *sendCmd) Validate(fs *pflag.FlagSet) error {
	if err := validTenant(c.tenant); err != nil {
		return err
	}
	want := 2
	if c.interrupt || c.end {
		want = 1
	}
	if c.interrupt && c.end {
		return errors.New("--interrupt and --end exclude each other")
	}
	if fs.NArg() != want {
		return fmt.Errorf("want %d arguments, got %d", want, fs.NArg())
	}
	if !protocol.ValidID(fs.Arg(0)) {
		return fmt.Errorf("%q is not a query id (%s)", fs.Arg(0), protocol.IDPattern)
	}
	c.id = fs.Arg(0)
	if want == 2 {
		c.text = fs.Arg(1)
	}
	return nil
}

func (c *sendCmd) Run(ctx context.Context, e *Env) int {
	req := protocol.SessionOpRequest{ID: c.id, Tenant: c.tenant, SessionOp: protocol.SessionOp{Text: c.text, UUID: c.uuid}}
	switch {
	case c.interrupt:
		return sessionOp(ctx, e, protocol.OpInterrupt, req)
	case c.end:
		return sessionOp(ctx, e, protocol.OpEnd, req)
	}
	return sessionOp(ctx, e, protocol.OpInput, req)
}

// approveCmd answers a session's permission request.
type approveCmd struct {
	tenant, id, requestID, message string
	deny                           bool
}

func (c *approveCmd) Help() Help {
	return Help{
		Name: "approve", Args: "<id> <request_id>",
		Summary: "answer a session's permission request (allow, or --deny)",
		Description: `A session submitted with --approvals remote waits (status awaiting_approval,
with request_id and tool_name) when its agent asks to use a tool. This
answers: allow by default, --deny [--message why] to refuse.`,
		Examples: `dispatcher approve s1 req_42
dispatcher approve s1 req_43 --deny --message "not on main"`,
	}
}

func (c *approveCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	fs.BoolVar(&c.deny, "deny", false, "refuse the tool use")
	fs.StringVar(&c.message, "message", "", "why (shown to the model on deny)")
}

func (c *approveCmd) Validate(fs *pflag.FlagSet) error {
	if err := validTenant(c.tenant); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("want <id> <request_id>, got %d arguments", fs.NArg())
	}
	if !protocol.ValidID(fs.Arg(0)) {
		return fmt.Errorf("%q is not a query id (%s)", fs.Arg(0), protocol.IDPattern)
	}
	c.id, c.requestID = fs.Arg(0), fs.Arg(1)
	return nil
}

func (c *approveCmd) Run(ctx context.Context, e *Env) int {
	allow := !c.deny
	return sessionOp(ctx, e, protocol.OpApprove, protocol.SessionOpRequest{ID: c.id, Tenant: c.tenant,
		SessionOp: protocol.SessionOp{RequestID: c.requestID, Allow: &allow, Message: c.message}})
}
