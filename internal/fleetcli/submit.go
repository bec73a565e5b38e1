package fleetcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// submitCmd submits a job and, with --follow, renders it to its end.
type submitCmd struct {
	tenant, id, file string
	follow           bool
	render           renderFlags
	job              protocol.Job
	maxTurns         int
	budget           float64
	timeoutS         int
	sys, appendSys   string
	meta             []string
	words            []string
	workspace        *workspaceFlags
	session          bool
	idleTimeoutS     int
	approvals        string
}

func (c *submitCmd) Help() Help {
	return Help{
		Name: "submit", Args: "[prompt words…]",
		Summary: "submit a job (prompt from words, --file, or stdin)",
		Description: `Puts a query job on the work queue through the dispatcher and prints its id
(stdout) and how to follow it (stderr). With --follow it renders the run as
it happens (text, tool calls and results, then cost, turns and duration) and
exits with the query's code; a workspace job (--repo: the agent works in a
checkout of that repository) then ends with the changed files. Submitting an id again within the dedupe window
queues nothing: the command says it is a duplicate (and --follow follows the
earlier run).`,
		Examples: `dispatcher submit --follow "List the files here"
dispatcher submit --tenant acme --id q2 --model sonnet --max-turns 5 --file prompt.txt
echo "Summarise README.md" | dispatcher submit --meta ticket=OPS-7
dispatcher submit --follow "/standin lines=20 delay=1s"   # a slow stand-in run, to try cancel
dispatcher submit --repo https://git.example.com/app.git --push --follow "Fix the failing test"
dispatcher submit --session --id s1 --approvals remote "Start on the parser"   # then: send, approve, attach`,
	}
}

func (c *submitCmd) Flags(fs *pflag.FlagSet) {
	addTenant(fs, &c.tenant)
	o := &c.job.Options
	fs.StringVar(&c.id, "id", "", "query id (assigned when empty)")
	fs.StringVarP(&c.file, "file", "f", "", "read the prompt from this file ('-' for stdin)")
	fs.BoolVar(&c.follow, "follow", false, "render the run live until it ends; the exit code is the query's")
	c.render.add(fs)
	fs.StringVar(&o.Model, "model", "", "options.model")
	fs.IntVar(&c.maxTurns, "max-turns", 0, "options.max_turns")
	fs.Float64Var(&c.budget, "max-budget-usd", 0, "options.max_budget_usd")
	fs.StringVar(&o.PermissionMode, "permission-mode", "", "options.permission_mode")
	fs.StringSliceVar(&o.AllowedTools, "allowed-tools", nil, "options.allowed_tools")
	fs.StringSliceVar(&o.DisallowedTools, "disallowed-tools", nil, "options.disallowed_tools")
	fs.StringVar(&c.sys, "system-prompt", "", "options.system_prompt")
	fs.StringVar(&c.appendSys, "append-system-prompt", "", "options.append_system_prompt")
	fs.StringVar(&o.Resume, "resume", "", "options.resume (session id)")
	fs.IntVar(&c.timeoutS, "timeout-s", 0, "options.timeout_s (wall-clock limit of the run)")
	fs.StringVar(&c.job.Sandbox, "sandbox", "", "sandbox provider: local or cloudflare (default: the worker's)")
	fs.StringSliceVar(&c.meta, "meta", nil, "metadata key=value (repeatable)")
	c.workspace = addWorkspaceFlags(fs)
	fs.BoolVar(&c.session, "session", false, "a multi-turn session: send inputs with 'dispatcher send', end it with 'send --end'")
	fs.IntVar(&c.idleTimeoutS, "idle-timeout-s", 0, "session.idle_timeout_s: park the idle session after this long [300]")
	fs.StringVar(&c.approvals, "approvals", "", "session.approvals: none or remote (permission requests answered with 'dispatcher approve')")
}

func (c *submitCmd) Validate(fs *pflag.FlagSet) error {
	if err := validTenant(c.tenant); err != nil {
		return err
	}
	if c.id != "" && !protocol.ValidID(c.id) {
		return fmt.Errorf("--id %q: must match %s", c.id, protocol.IDPattern)
	}
	if c.file != "" && fs.NArg() > 0 {
		return errors.New("give the prompt as words or with --file, not both")
	}
	if err := c.render.validate(c.follow); err != nil {
		return err
	}
	c.job.ID, c.job.Tenant, c.words = c.id, c.tenant, fs.Args()
	o := &c.job.Options
	if fs.Changed("max-turns") {
		o.MaxTurns = &c.maxTurns
	}
	if fs.Changed("max-budget-usd") {
		o.MaxBudgetUSD = &c.budget
	}
	if fs.Changed("timeout-s") {
		o.TimeoutS = &c.timeoutS
	}
	if fs.Changed("system-prompt") {
		o.SystemPrompt = &c.sys
	}
	if fs.Changed("append-system-prompt") {
		o.AppendSystemPrompt = &c.appendSys
	}
	for _, kv := range c.meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--meta %q: want key=value", kv)
		}
		if c.job.Metadata == nil {
			c.job.Metadata = map[string]string{}
		}
		c.job.Metadata[k] = v
	}
	if c.session || fs.Changed("idle-timeout-s") || fs.Changed("approvals") {
		c.job.Session = &protocol.Session{Approvals: c.approvals}
		if fs.Changed("idle-timeout-s") {
			c.job.Session.IdleTimeoutS = &c.idleTimeoutS
		}
	}
	return c.workspace.apply(&c.job)
}

func (c *submitCmd) Run(ctx context.Context, e *Env) int {
	prompt, err := readPrompt(c.words, c.file, e.In)
	if err != nil {
		fmt.Fprintln(e.Err, err)
		return ExitUsage
	}
	c.job.Prompt = prompt
	cl, code := e.Client()
	if cl == nil {
		return code
	}
	rctx, cancel := e.Request(ctx)
	r, err := cl.Submit(rctx, c.job)
	cancel()
	if err != nil {
		return requestFailed(ctx, e.Err, err)
	}
	if r.Error != nil {
		fmt.Fprintf(e.Err, "rejected: %s: %s\n", r.Error.Code, r.Error.Message)
		return ExitRejected
	}
	if r.Duplicate {
		fmt.Fprintf(e.Err, "duplicate: %s/%s was already submitted within the dedupe window; nothing new was queued\n", r.Tenant, r.ID)
	}
	if !c.follow {
		fmt.Fprintln(e.Out, r.ID)
		if !r.Duplicate {
			fmt.Fprintf(e.Err, "submitted %s/%s; follow it with: dispatcher tail %s --tenant %s\n", r.Tenant, r.ID, r.ID, r.Tenant)
		}
		return ExitOK
	}
	if r.Duplicate {
		fmt.Fprintf(e.Err, "following the earlier run of %s/%s\n", r.Tenant, r.ID)
	} else {
		fmt.Fprintf(e.Err, "submitted %s/%s\n", r.Tenant, r.ID)
	}
	return follow(ctx, e, cl, r.Tenant, r.ID, true, c.render, followHooks{})
}

func readPrompt(words []string, file string, stdin io.Reader) (string, error) {
	switch {
	case file == "-" || (file == "" && len(words) == 0):
		if f, ok := stdin.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				return "", errors.New("no prompt: give it as words, with --file, or on stdin")
			}
		}
		b, err := io.ReadAll(io.LimitReader(stdin, protocol.MaxPromptBytes+1))
		return string(b), err
	case file != "":
		b, err := os.ReadFile(file)
		return string(b), err
	default:
		return strings.Join(words, " "), nil
	}
}
