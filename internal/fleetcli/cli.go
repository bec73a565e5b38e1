package fleetcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/config"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
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
	ExitRejected    = 6 // the job was rejected as invalid, or a command cannot apply (an answered request, an ended query)
	ExitRunning     = 7 // status: the query has not ended yet
	// ExitSignal + N: stopped by signal N (130 SIGINT, 143 SIGTERM); the
	// query keeps running.
	ExitSignal = 128
)

// commands are the client commands, in the order help lists them. A new
// command is a new file and one line here.
var commands = []func() Command{
	func() Command { return &submitCmd{} },
	func() Command { return &tailCmd{} },
	func() Command { return &statusCmd{} },
	func() Command { return &cancelCmd{} },
	func() Command { return &lsCmd{} },
	func() Command { return &scheduleCmd{} },
	func() Command { return &diffCmd{} },
	func() Command { return &sendCmd{} },
	func() Command { return &approveCmd{} },
	func() Command { return &attachCmd{} },
	func() Command { return &workersCmd{} },
	func() Command { return &drainCmd{} },
	func() Command { return &versionCmd{} },
	func() Command { return &tenantCmd{} },
	func() Command { return &tenantAuthCmd{} }, // listed; reached through authCommand
	func() Command { return &authCmd{} },
}

// Command is one client command.
type Command interface {
	// Help describes the command for `dispatcher <name> --help`.
	Help() Help
	// Flags defines the command's own flags on fs.
	Flags(fs *pflag.FlagSet)
	// Validate checks the parsed flags and arguments; an error is a usage
	// error (exit 2) and nothing has connected yet.
	Validate(fs *pflag.FlagSet) error
	// Run runs the command and returns its exit code.
	Run(ctx context.Context, e *Env) int
}

// Help is a command's help text.
type Help struct {
	Name string
	// Args is the synopsis after the name, e.g. "<id>".
	Args string
	// Summary is one line for the command list.
	Summary string
	// Description is the paragraph of `<name> --help`.
	Description string
	// Examples are command lines, one per line (comments after #).
	Examples string
}

// IO are a command's streams.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

// Env is what a running command gets: its streams, its logger, and the
// fleet client (connected on first use).
type Env struct {
	IO
	Common  config.Common
	Timeout time.Duration
	Log     zerolog.Logger

	client *fleetapi.Client
	nc     *nats.Conn
	errw   *gatedWriter
	// apiPrefix is the JetStream API prefix of tenant creds (auth.go).
	apiPrefix string
}

// Client connects to NATS on first use. On failure it has printed why and
// returns the exit code to use.
func (e *Env) Client() (*fleetapi.Client, int) {
	if e.client != nil {
		return e.client, ExitOK
	}
	log := e.Log
	nc, err := config.Connect(e.Common, "fleet-cli", log, nats.RetryOnFailedConnect(false), nats.MaxReconnects(3))
	if err != nil {
		fmt.Fprintf(e.Err, "cannot reach NATS at %s: %v%s\n", config.RedactURLs(e.Common.NATSURL), err, credsHint(e.Common.NATSCreds, err))
		return nil, ExitUnavailable
	}
	log.Debug().Str("url", nc.ConnectedUrlRedacted()).Msg("connected to NATS")
	newClient := fleetapi.NewClient
	if e.apiPrefix != "" { // tenant creds (auth.go)
		newClient = func(nc *nats.Conn, n protocol.Names) (*fleetapi.Client, error) {
			return fleetapi.NewTenantClient(nc, n, e.apiPrefix)
		}
	}
	c, err := newClient(nc, protocol.NewNames(e.Common.Prefix))
	if err != nil {
		nc.Close()
		fmt.Fprintln(e.Err, err)
		return nil, ExitUnavailable
	}
	e.nc, e.client = nc, c
	return c, ExitOK
}

// Request is a context for one API request: ctx bounded by --timeout.
func (e *Env) Request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.Timeout)
}

func (e *Env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
	// NATS calls its handlers from its own goroutines, possibly after Run
	// returned; they log through a writer that is shut now.
	e.errw.shut()
}

// Usage is the dispatcher's top-level help.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: dispatcher <command> [flags]\n\ncommands:\n")
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  serve [flags]\trun the dispatcher service (and with --http its dashboard)\n")
	for _, mk := range commands {
		h := mk().Help()
		fmt.Fprintf(tw, "  %s %s\t%s\n", h.Name, h.Args, h.Summary)
	}
	_ = tw.Flush()
	b.WriteString(`
'dispatcher <command> --help' describes a command, its flags and examples.

exit codes: 0 ok/succeeded, 1 query failed, 2 usage, 3 not found, 4 cancelled,
            5 unreachable/error, 6 job rejected, 7 not finished yet (status),
            128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM; the query keeps running)
`)
	return b.String()
}

func lookup(name string) Command {
	for _, mk := range commands {
		if c := mk(); c.Help().Name == name {
			return c
		}
	}
	return nil
}

// Run runs the client command args[0] with the rest of args.
func Run(ctx context.Context, args []string, stdio IO) int {
	if len(args) == 0 {
		fmt.Fprint(stdio.Err, Usage())
		return ExitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "--help":
		if len(args) > 1 && lookup(args[1]) != nil {
			return Run(ctx, []string{args[1], "--help"}, stdio)
		}
		fmt.Fprint(stdio.Out, Usage())
		return ExitOK
	case "--version":
		name = "version"
	}
	cmd := lookup(name)
	if c := authCommand(args); c != nil {
		cmd = c
	}
	if cmd == nil {
		fmt.Fprintf(stdio.Err, "unknown command %q\n\n%s", name, Usage())
		return ExitUsage
	}
	h := cmd.Help()
	own := pflag.NewFlagSet("dispatcher "+name, pflag.ContinueOnError)
	cmd.Flags(own)
	var (
		common  config.Common
		timeout time.Duration
	)
	shared := pflag.NewFlagSet("common", pflag.ContinueOnError)
	config.AddCommon(shared, &common, "client")
	// People read the CLI's own logs: console warnings unless asked.
	shared.Lookup("log-format").DefValue, common.LogFormat = "console", "console"
	shared.Lookup("log-level").DefValue, common.LogLevel = "warn", "warn"
	shared.DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the dispatcher's reply (env FLEET_TIMEOUT)")
	fs := pflag.NewFlagSet("dispatcher "+name, pflag.ContinueOnError)
	fs.AddFlagSet(own)
	fs.AddFlagSet(shared)
	fs.SetOutput(stdio.Err)
	fs.Usage = func() { fmt.Fprint(stdio.Out, commandHelp(h, own, shared)) }
	if err := config.Parse(fs, args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintf(stdio.Err, "dispatcher %s: %v\nsee 'dispatcher %s --help'\n", name, err, name)
		return ExitUsage
	}
	apiPrefix, code, ok := credsTenant(fs, &common, stdio.Err)
	if !ok {
		return code
	}
	err := cmd.Validate(fs)
	if err == nil && timeout <= 0 {
		err = errors.New("--timeout must be positive")
	}
	errw := &gatedWriter{w: stdio.Err}
	log, lerr := config.Logger(common, errw)
	if err == nil {
		err = lerr
	}
	if err != nil {
		fmt.Fprintf(stdio.Err, "dispatcher %s: %v\nsee 'dispatcher %s --help'\n", name, err, name)
		return ExitUsage
	}
	e := &Env{IO: stdio, Common: common, Timeout: timeout, Log: log, errw: errw}
	e.apiPrefix = apiPrefix
	defer e.close()
	return cmd.Run(ctx, e)
}

func commandHelp(h Help, own, shared *pflag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: dispatcher %s [flags] %s\n\n%s\n", h.Name, h.Args, h.Summary)
	if h.Description != "" {
		fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(h.Description))
	}
	if u := own.FlagUsages(); u != "" {
		fmt.Fprintf(&b, "\nflags:\n%s", u)
	}
	fmt.Fprintf(&b, "\ncommon flags (each also read from FLEET_<NAME>):\n%s", shared.FlagUsages())
	if h.Examples != "" {
		b.WriteString("\nexamples:\n")
		for l := range strings.SplitSeq(strings.TrimSpace(h.Examples), "\n") {
			fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(l))
		}
	}
	return b.String()
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

// SignalError is the cancel cause of a context ended by a signal.
type SignalError struct{ Signal os.Signal }

func (e SignalError) Error() string { return "interrupted by " + e.Signal.String() }

// ExitCode is 128 + the signal's number.
func (e SignalError) ExitCode() int {
	if s, ok := e.Signal.(syscall.Signal); ok {
		return ExitSignal + int(s)
	}
	return ExitSignal + int(syscall.SIGINT)
}

// SignalContext returns a context cancelled, with a SignalError cause, by
// the first SIGINT or SIGTERM; stop releases the signals.
func SignalContext(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			cancel(SignalError{Signal: s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(context.Canceled)
	}
}

// interrupted reports whether ctx ended (a signal, or the caller), and the
// exit code for that.
func interrupted(ctx context.Context) (int, bool) {
	if ctx.Err() == nil {
		return 0, false
	}
	var se SignalError
	if errors.As(context.Cause(ctx), &se) {
		return se.ExitCode(), true
	}
	return ExitSignal + int(syscall.SIGINT), true
}

// replyError prints an API error and maps its code to an exit code.
func replyError(w io.Writer, e *protocol.ErrorInfo) int {
	fmt.Fprintf(w, "%s: %s\n", e.Code, e.Message)
	switch e.Code {
	case protocol.CodeNotFound:
		return ExitNotFound
	case protocol.CodeInvalidJob:
		return ExitUsage
	case "no_such_request":
		return ExitNotFound
	case "already_answered", "already_finished", "not_a_session", "exists":
		return ExitRejected
	}
	return ExitUnavailable
}

// requestFailed prints a failed request and returns its exit code.
func requestFailed(ctx context.Context, w io.Writer, err error) int {
	if code, ok := interrupted(ctx); ok {
		return code
	}
	fmt.Fprintln(w, err)
	return ExitUnavailable
}

// stateExit is the exit code of a query's state.
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

// addTenant defines --tenant.
func addTenant(fs *pflag.FlagSet, tenant *string) {
	fs.StringVarP(tenant, "tenant", "t", protocol.DefaultTenant, "the query's tenant")
}

// oneID validates the single <id> argument and the tenant.
func oneID(fs *pflag.FlagSet, tenant string) error {
	if fs.NArg() != 1 {
		return fmt.Errorf("want exactly one query id, got %d arguments", fs.NArg())
	}
	if !protocol.ValidID(fs.Arg(0)) {
		return fmt.Errorf("%q is not a query id (%s)", fs.Arg(0), protocol.IDPattern)
	}
	return validTenant(tenant)
}

func validTenant(tenant string) error {
	if !protocol.ValidTenant(tenant) {
		return fmt.Errorf("--tenant %q: must match %s", tenant, protocol.TenantPattern)
	}
	return nil
}
