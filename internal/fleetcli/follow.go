package fleetcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/internal/render"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// renderFlags are the flags of the commands that render a run.
type renderFlags struct {
	raw, verbose bool
	color        string
}

func (r *renderFlags) add(fs *pflag.FlagSet) {
	fs.BoolVar(&r.raw, "raw", false, "print the stream's lines byte for byte instead of rendering them (a line too large for one NATS message is there as its x_fleet_large_line pointer; the stored transcript.ndjson holds it whole)")
	fs.BoolVarP(&r.verbose, "verbose", "v", false, "also show message types that are not rendered")
	fs.StringVar(&r.color, "color", "auto", "colour the rendering: auto (on a terminal, unless NO_COLOR is set), always, never")
}

// validate checks the flags; rendering says whether the command renders
// at all (submit without --follow does not).
func (r *renderFlags) validate(rendering bool) error {
	switch r.color {
	case "auto", "always", "never":
	default:
		return fmt.Errorf("--color must be auto, always or never, not %q", r.color)
	}
	if !rendering && (r.raw || r.verbose) {
		return errors.New("--raw and --verbose apply only with --follow")
	}
	if r.raw && r.verbose {
		return errors.New("--raw prints every line already; --verbose applies to the rendering")
	}
	return nil
}

// useColor decides --color auto: a terminal, NO_COLOR unset, TERM not dumb.
func (r *renderFlags) useColor(w io.Writer) bool {
	switch r.color {
	case "always":
		return true
	case "never":
		return false
	}
	return isTerminal(w) && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Intervals of the waiting notice.
const (
	// waitNotice is how long a query may sit queued before the command
	// says why it waits.
	waitNotice = 2 * time.Second
	// waitPoll is how often the queue position is asked for while queued.
	waitPoll = 3 * time.Second
	// waitRepeat is how often an unchanged notice is repeated when stderr
	// is not a terminal.
	waitRepeat = 30 * time.Second
)

// followHooks see every line and status event follow renders (attach's
// prompts); nil fields are skipped.
type followHooks struct {
	Line   func([]byte)
	Status func(protocol.StatusEvent)
}

// follow renders (or with --raw copies) a query's lines and status events
// until it ends, says why it waits while it is queued, and on a signal
// stops with a hint to re-attach. The exit code is the query's.
func follow(ctx context.Context, e *Env, c *fleetapi.Client, tenant, id string, keepFollowing bool, rf renderFlags, hooks followHooks) int {
	p := &render.Printer{W: e.Out, Verbose: rf.verbose, Color: rf.useColor(e.Out)}
	w := &waiter{e: e, c: c, tty: isTerminal(e.Err), start: time.Now(), state: protocol.StateQueued}
	var artifact *protocol.Artifact
	f := fleetapi.Follower{
		Artifact:  func(a protocol.Artifact) { artifact = &a },
		MustExist: true,
		Line: func(l fleetapi.Line) {
			w.activity(nil)
			if rf.raw {
				_, _ = e.Out.Write(append(append([]byte(nil), l.Data...), '\n'))
			} else {
				p.Line(l.Data)
			}
			if hooks.Line != nil {
				hooks.Line(l.Data)
			}
		},
		Status: func(ev protocol.StatusEvent) {
			w.activity(&ev)
			if !rf.raw {
				p.Status(ev)
			}
			if hooks.Status != nil {
				hooks.Status(ev)
			}
		},
	}
	wctx, stopWaiting := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if keepFollowing {
		wg.Go(func() { w.run(wctx) })
	}
	final, err := c.Follow(ctx, tenant, id, keepFollowing, f)
	stopWaiting()
	wg.Wait()
	w.clear()
	if code, ok := interrupted(ctx); ok {
		fmt.Fprintf(e.Err, "\nstopped following %s/%s; the query keeps running. Re-attach with: dispatcher tail %s --tenant %s\n", tenant, id, id, tenant)
		return code
	}
	if errors.Is(err, fleetapi.ErrNotFound) {
		fmt.Fprintf(e.Err, "no query %s/%s\n", tenant, id)
		return ExitNotFound
	}
	if err != nil {
		fmt.Fprintln(e.Err, err)
		return ExitUnavailable
	}
	if artifact != nil && !rf.raw {
		p.Artifact(*artifact) // the run's changed files end the output
	}
	return stateExit(final)
}

// waiter says why a followed query waits: while it is queued, its position
// and how many workers are there to take it; on a terminal, a live line
// with the time waited.
type waiter struct {
	e     *Env
	c     *fleetapi.Client
	tty   bool
	start time.Time

	mu       sync.Mutex
	state    protocol.State
	jobSeq   uint64
	last     time.Time // last line or event
	shown    bool      // a live line is on the terminal
	said     string    // the last notice printed (not a terminal)
	saidAt   time.Time
	info     *fleetapi.QueueInfo
	infoTime time.Time
}

func (w *waiter) activity(ev *protocol.StatusEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clearLocked()
	w.last = time.Now()
	if ev != nil {
		w.state = ev.State
		if ev.JobSeq != 0 {
			w.jobSeq = ev.JobSeq
		}
	} else if w.state == protocol.StateQueued {
		w.state = protocol.StateRunning
	}
}

func (w *waiter) clear() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clearLocked()
}

func (w *waiter) clearLocked() {
	if w.shown {
		fmt.Fprint(w.e.Err, "\r\033[K")
		w.shown = false
	}
}

func (w *waiter) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		state, jobSeq, infoTime := w.state, w.jobSeq, w.infoTime
		w.mu.Unlock()
		if state != protocol.StateQueued && state != protocol.StateRetrying {
			if w.tty {
				w.tick(fmt.Sprintf("%s · %s", state, w.since()))
			}
			continue
		}
		if time.Since(w.start) < waitNotice {
			continue
		}
		if time.Since(infoTime) >= waitPoll {
			rctx, cancel := w.e.Request(ctx)
			info, err := w.c.Queue(rctx, jobSeq)
			cancel()
			w.mu.Lock()
			w.infoTime = time.Now()
			if err == nil {
				w.info = &info
			} else {
				w.e.Log.Debug().Err(err).Msg("asking for the queue position")
			}
			w.mu.Unlock()
		}
		w.notice(state)
	}
}

func (w *waiter) since() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.start).Truncate(time.Second).String()
}

// notice prints the queued notice: live on a terminal, else when it
// changes (or every waitRepeat).
func (w *waiter) notice(state protocol.State) {
	w.mu.Lock()
	info := w.info
	w.mu.Unlock()
	msg := string(state)
	if info != nil {
		msg += ", " + info.String()
	}
	if w.tty {
		w.tick(msg + " · waiting " + w.since())
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if msg == w.said && time.Since(w.saidAt) < waitRepeat {
		return
	}
	w.said, w.saidAt = msg, time.Now()
	fmt.Fprintf(w.e.Err, "%s (waiting %s)\n", msg, time.Since(w.start).Truncate(time.Second))
}

// tick rewrites the live line on a terminal, once no output came for a
// moment.
func (w *waiter) tick(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.last) < waitNotice && w.state != protocol.StateQueued {
		return
	}
	fmt.Fprintf(w.e.Err, "\r\033[K… %s", msg)
	w.shown = true
}
