package fleetcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/render"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Exit codes of the dispatcher's client commands.
const (
	ExitOK          = 0 // done; the query succeeded (submit --follow, tail, status)
	ExitFailed      = 1 // the query failed
	ExitUsage       = 2 // bad command line
	ExitNotFound    = 3 // no such query
	ExitCancelled   = 4 // the query was cancelled
	ExitUnavailable = 5 // NATS or the dispatcher unreachable, or another error
	ExitRejected    = 6 // the job was rejected as invalid
	ExitRunning     = 7 // status: the query has not ended yet
)

// Usage is the client commands' help.
const Usage = `client commands:
  dispatcher submit [flags] [prompt words…]   submit a job (prompt from words, --file, or stdin)
  dispatcher tail <id> [--tenant T] [--raw]   replay a query from its first message, then follow it
  dispatcher status <id> [--tenant T]         print a query's status (JSON)
  dispatcher cancel <id> [--tenant T]         cancel a running or queued query
  dispatcher ls [--tenant T] [--state S]      recent queries
  dispatcher diff <id> [--tenant T] [--stat]  a workspace job's stored diff (--stat: its changed files)

submit --repo URL [--ref R] [--depth N] [--branch B] [--push] runs the agent in a
checkout of a git repository; --follow then ends with the changed files.

exit codes: 0 ok/succeeded, 1 query failed, 2 usage, 3 not found, 4 cancelled,
            5 unreachable/error, 6 job rejected, 7 not finished yet (status)
`

// IO are a command's streams.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

// Run runs client command cmd with args.
func Run(ctx context.Context, cmd string, args []string, stdio IO) int {
	fs := pflag.NewFlagSet("dispatcher "+cmd, pflag.ContinueOnError)
	fs.SetOutput(stdio.Err)
	var common config.Common
	config.AddCommon(fs, &common, "client")
	var (
		tenant                               = fs.String("tenant", protocol.DefaultTenant, "tenant")
		raw                                  = fs.Bool("raw", false, "print raw stream-json lines instead of rendering them")
		verbose                              = fs.BoolP("verbose", "v", false, "also show message types that are not rendered")
		timeout                              = fs.Duration("timeout", 10*time.Second, "how long to wait for the dispatcher's reply")
		id, file, model, perm, resume, sandb string
		sys, appendSys                       string
		follow, noFollow, asJSON             bool
		maxTurns, timeoutS                   int
		budget                               float64
		allowed, disallowed, meta            []string
		state                                string
		limit                                int
		wsf                                  *workspaceFlags
		stat                                 bool
		storageURL                           string
	)
	switch cmd {
	case "submit":
		fs.StringVar(&id, "id", "", "query id (assigned when empty)")
		fs.StringVarP(&file, "file", "f", "", "read the prompt from this file ('-' for stdin)")
		fs.BoolVar(&follow, "follow", false, "render the run live until it ends; the exit code is the query's")
		fs.StringVar(&model, "model", "", "options.model")
		fs.IntVar(&maxTurns, "max-turns", 0, "options.max_turns")
		fs.Float64Var(&budget, "max-budget-usd", 0, "options.max_budget_usd")
		fs.StringVar(&perm, "permission-mode", "", "options.permission_mode")
		fs.StringSliceVar(&allowed, "allowed-tools", nil, "options.allowed_tools")
		fs.StringSliceVar(&disallowed, "disallowed-tools", nil, "options.disallowed_tools")
		fs.StringVar(&sys, "system-prompt", "", "options.system_prompt")
		fs.StringVar(&appendSys, "append-system-prompt", "", "options.append_system_prompt")
		fs.StringVar(&resume, "resume", "", "options.resume (session id)")
		fs.IntVar(&timeoutS, "timeout-s", 0, "options.timeout_s (wall-clock limit of the run)")
		fs.StringVar(&sandb, "sandbox", "", "sandbox provider: local or cloudflare")
		fs.StringSliceVar(&meta, "meta", nil, "metadata key=value (repeatable)")
		wsf = addWorkspaceFlags(fs)
	case "diff":
		fs.BoolVar(&stat, "stat", false, "print the changed files (from the manifest) instead of the diff")
		fs.StringVar(&storageURL, "storage", "file://./data", "the fleet's storage URL, where the diff is (env FLEET_STORAGE)")
	case "tail":
		fs.BoolVar(&noFollow, "no-follow", false, "stop after the replay instead of following")
	case "status":
		fs.BoolVar(&asJSON, "json", true, "print JSON")
	case "ls":
		fs.StringVar(&state, "state", "", "only queries in this state")
		fs.IntVar(&limit, "limit", 50, "at most this many")
	case "cancel":
	default:
		fmt.Fprintf(stdio.Err, "unknown command %q\n\n%s", cmd, Usage)
		return ExitUsage
	}
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintln(stdio.Err, err)
		return ExitUsage
	}
	// NATS calls its handlers from its own goroutines, possibly after Run
	// returned; they log through a writer that is shut when Run returns.
	errw := &gatedWriter{w: stdio.Err}
	defer errw.shut()
	log, _ := config.Logger(config.Common{LogFormat: "console", LogLevel: "warn"}, errw)
	nc, err := config.Connect(common, "fleet-cli", log, nats.RetryOnFailedConnect(false), nats.MaxReconnects(3))
	if err != nil {
		fmt.Fprintf(stdio.Err, "cannot reach NATS at %s: %v\n", config.RedactURLs(common.NATSURL), err)
		return ExitUnavailable
	}
	defer nc.Close()
	c, err := NewClient(nc, protocol.NewNames(common.Prefix))
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return ExitUnavailable
	}
	p := &render.Printer{W: stdio.Out, Verbose: *verbose}
	rctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	switch cmd {
	case "submit":
		prompt, err := readPrompt(fs.Args(), file, stdio.In)
		if err != nil {
			fmt.Fprintln(stdio.Err, err)
			return ExitUsage
		}
		job := protocol.Job{ID: id, Prompt: prompt, Tenant: *tenant, Sandbox: sandb}
		o := &job.Options
		o.Model, o.PermissionMode, o.Resume = model, perm, resume
		o.AllowedTools, o.DisallowedTools = allowed, disallowed
		if fs.Changed("max-turns") {
			o.MaxTurns = &maxTurns
		}
		if fs.Changed("max-budget-usd") {
			o.MaxBudgetUSD = &budget
		}
		if fs.Changed("timeout-s") {
			o.TimeoutS = &timeoutS
		}
		if fs.Changed("system-prompt") {
			o.SystemPrompt = &sys
		}
		if fs.Changed("append-system-prompt") {
			o.AppendSystemPrompt = &appendSys
		}
		for _, kv := range meta {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fmt.Fprintf(stdio.Err, "--meta %q: want key=value\n", kv)
				return ExitUsage
			}
			if job.Metadata == nil {
				job.Metadata = map[string]string{}
			}
			job.Metadata[k] = v
		}
		if err := wsf.apply(&job); err != nil {
			fmt.Fprintln(stdio.Err, err)
			return ExitUsage
		}
		r, err := c.Submit(rctx, job)
		if err != nil {
			fmt.Fprintln(stdio.Err, err)
			return ExitUnavailable
		}
		if r.Error != nil {
			fmt.Fprintf(stdio.Err, "rejected: %s: %s\n", r.Error.Code, r.Error.Message)
			return ExitRejected
		}
		if !follow {
			fmt.Fprintln(stdio.Out, r.ID)
			fmt.Fprintf(stdio.Err, "submitted %s/%s; follow it with: dispatcher tail %s --tenant %s\n", r.Tenant, r.ID, r.ID, r.Tenant)
			return ExitOK
		}
		fmt.Fprintf(stdio.Err, "submitted %s/%s\n", r.Tenant, r.ID)
		return follower(ctx, c, r.Tenant, r.ID, true, *raw, p, stdio)
	case "tail":
		if fs.NArg() != 1 {
			fmt.Fprintln(stdio.Err, "usage: dispatcher tail <id> [--tenant T]")
			return ExitUsage
		}
		return follower(ctx, c, *tenant, fs.Arg(0), !noFollow, *raw, p, stdio)
	case "diff":
		if fs.NArg() != 1 {
			fmt.Fprintln(stdio.Err, "usage: dispatcher diff <id> [--tenant T] [--stat]")
			return ExitUsage
		}
		return runDiff(rctx, c, *tenant, fs.Arg(0), stat, storageURL, p, stdio)
	case "status", "cancel":
		if fs.NArg() != 1 {
			fmt.Fprintf(stdio.Err, "usage: dispatcher %s <id> [--tenant T]\n", cmd)
			return ExitUsage
		}
		ref := protocol.QueryRef{ID: fs.Arg(0), Tenant: *tenant}
		var r protocol.APIReply
		if cmd == "status" {
			r, err = c.Status(rctx, ref)
		} else {
			r, err = c.Cancel(rctx, ref)
		}
		if err != nil {
			fmt.Fprintln(stdio.Err, err)
			return ExitUnavailable
		}
		if r.Status != nil {
			b, _ := json.MarshalIndent(r.Status, "", "  ")
			fmt.Fprintln(stdio.Out, string(b))
		}
		if r.Error != nil {
			fmt.Fprintf(stdio.Err, "%s: %s\n", r.Error.Code, r.Error.Message)
			switch r.Error.Code {
			case protocol.CodeNotFound:
				return ExitNotFound
			case "already_finished":
				return ExitOK
			case protocol.CodeInvalidJob:
				return ExitUsage
			}
			return ExitUnavailable
		}
		if cmd == "cancel" {
			fmt.Fprintf(stdio.Err, "cancel requested for %s/%s\n", ref.Tenant, ref.ID)
			return ExitOK
		}
		return stateExit(r.Status)
	case "ls":
		req := protocol.ListRequest{State: protocol.State(state), Limit: limit}
		if fs.Changed("tenant") {
			req.Tenant = *tenant
		}
		r, err := c.List(rctx, req)
		if err != nil {
			fmt.Fprintln(stdio.Err, err)
			return ExitUnavailable
		}
		if r.Error != nil {
			fmt.Fprintf(stdio.Err, "%s: %s\n", r.Error.Code, r.Error.Message)
			return ExitUnavailable
		}
		tw := tabwriter.NewWriter(stdio.Out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tID\tSTATE\tATTEMPT\tAT\tERROR")
		for _, q := range r.Queries {
			e := ""
			if q.Error != nil {
				e = q.Error.Code
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", q.Tenant, q.ID, q.State, q.Attempt, q.At.Local().Format(time.DateTime), e)
		}
		_ = tw.Flush()
		return ExitOK
	}
	return ExitUsage
}

// gatedWriter forwards writes until shut, then drops them.
type gatedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

func (g *gatedWriter) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func follower(ctx context.Context, c *Client, tenant, id string, follow, raw bool, p *render.Printer, stdio IO) int {
	var artifact *protocol.Artifact
	f := Follower{
		Artifact: func(a protocol.Artifact) { artifact = &a },
		Line: func(l Line) {
			if raw {
				_, _ = stdio.Out.Write(append(append([]byte(nil), l.Data...), '\n'))
				return
			}
			p.Line(l.Data)
		},
		Status: func(ev protocol.StatusEvent) {
			if !raw {
				p.Status(ev)
			}
		},
	}
	final, err := c.Follow(ctx, tenant, id, follow, f)
	if err != nil {
		fmt.Fprintln(stdio.Err, err)
		return ExitUnavailable
	}
	if artifact != nil && !raw {
		p.Artifact(*artifact) // the run's changed files end the output
	}
	return stateExit(final)
}

func stateExit(ev *protocol.StatusEvent) int {
	if ev == nil {
		return ExitRunning
	}
	switch ev.State {
	case protocol.StateSucceeded:
		return ExitOK
	case protocol.StateFailed:
		if ev.Error != nil && ev.Error.Code == protocol.CodeInvalidJob {
			return ExitRejected
		}
		return ExitFailed
	case protocol.StateCancelled:
		return ExitCancelled
	default:
		return ExitRunning
	}
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
