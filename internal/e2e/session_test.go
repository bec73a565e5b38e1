package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// statusWatch collects a query's status events live.
type statusWatch struct {
	t   *testing.T
	mu  sync.Mutex
	evs []protocol.StatusEvent
	ch  chan struct{}
}

func watchStatus(t *testing.T, f *fleettest.Fleet, tenant, id string) *statusWatch {
	t.Helper()
	w := &statusWatch{t: t, ch: make(chan struct{}, 1)}
	sub, err := f.NC.Subscribe(f.Names.QueryStatus(tenant, id), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		w.mu.Lock()
		w.evs = append(w.evs, ev)
		w.mu.Unlock()
		select {
		case w.ch <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	require.NoError(t, f.NC.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

// waitFor waits for a status event matching ok (seen since the watch
// started) and returns it.
func (w *statusWatch) waitFor(what string, ok func(protocol.StatusEvent) bool) protocol.StatusEvent {
	w.t.Helper()
	deadline := time.After(wait)
	for {
		w.mu.Lock()
		for _, ev := range w.evs {
			if ok(ev) {
				w.mu.Unlock()
				return ev
			}
		}
		w.mu.Unlock()
		select {
		case <-w.ch:
		case <-deadline:
			w.t.Fatalf("timed out waiting for status %s", what)
		}
	}
}

func (w *statusWatch) state(s protocol.State, turn int) protocol.StatusEvent {
	w.t.Helper()
	return w.waitFor(string(s)+" turn "+fleettest.Itoa(turn), func(ev protocol.StatusEvent) bool {
		return ev.State == s && ev.Turn == turn
	})
}

func (w *statusWatch) all() []protocol.StatusEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]protocol.StatusEvent(nil), w.evs...)
}

// sendCtl publishes a .ctl op through JetStream (so FLEET_QUERIES has it).
func sendCtl(t *testing.T, f *fleettest.Fleet, tenant, id string, op protocol.CtlOp) {
	t.Helper()
	b, err := json.Marshal(op)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = f.JS.Publish(ctx, f.Names.QueryCtl(tenant, id), b)
	require.NoError(t, err)
}

func input(text string) protocol.CtlOp {
	return protocol.CtlOp{Op: protocol.OpInput, SessionOp: protocol.SessionOp{Text: text}}
}

func submitSession(t *testing.T, f *fleettest.Fleet, tenant, id, prompt string, s *protocol.Session, opts protocol.Options) {
	t.Helper()
	b, err := json.Marshal(protocol.Job{ID: id, Prompt: prompt, Session: s, Options: opts})
	require.NoError(t, err)
	f.PublishJob(tenant, b, map[string]string{protocol.HeaderMsgID: tenant + "." + id})
}

// results returns the result lines of a run, in order.
func results(r fleettest.Run) []map[string]any {
	var out []map[string]any
	for _, l := range r.Lines {
		if protocol.ParseMessage(l.Data).IsResult() {
			var m map[string]any
			_ = json.Unmarshal(l.Data, &m)
			out = append(out, m)
		}
	}
	return out
}

// TestStandinSessionTwoTurnsThenEnd runs a session with the stand-in agent:
// the prompt's turn, an input's turn, idle statuses with turn counts, end
// gives one succeeded status, Fleet-Seq contiguous.
func TestStandinSessionTwoTurnsThenEnd(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "st-1")
	submitSession(t, f, "default", "st-1", "first prompt", &protocol.Session{}, protocol.Options{})
	idle := sw.state(protocol.StateIdle, 1)
	require.NotEmpty(t, idle.ClaudeSessionID)
	sendCtl(t, f, "default", "st-1", input("second input"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "st-1", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "st-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Turn)
	res := results(r)
	require.Len(t, res, 2)
	var texts []string
	for _, l := range r.Lines {
		if strings.Contains(string(l.Data), `"isReplay":true`) {
			texts = append(texts, string(l.Data))
		}
	}
	require.Len(t, texts, 2)
	require.Contains(t, texts[0], "first prompt")
	require.Contains(t, texts[1], "second input")
	sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	terminal := 0
	for _, ev := range sw.all() {
		if ev.State.Terminal() {
			terminal++
		}
	}
	require.Equal(t, 1, terminal)
}

// TestCLISession: submit --session, send, then attach (the history, one
// typed input, /end), all through the dispatcher CLI with the stand-in.
func TestCLISession(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	url := f.Srv.ClientURL()
	sw := watchStatus(t, f, "default", "cli-s")
	code, out, errOut := runCLI(t, url, "", "submit", "--session", "--id", "cli-s", "--idle-timeout-s", "600", "hello", "session")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Equal(t, "cli-s\n", out)
	sw.state(protocol.StateIdle, 1)
	code, _, errOut = runCLI(t, url, "", "send", "cli-s", "second turn")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	sw.state(protocol.StateIdle, 2)
	code, _, _ = runCLI(t, url, "", "send", "nope", "x")
	require.Equal(t, fleetcli.ExitNotFound, code)
	code, _, _ = runCLI(t, url, "", "approve", "cli-s")
	require.Equal(t, fleetcli.ExitUsage, code)

	// attach: renders the history, sends the typed line, then /end.
	code, out, errOut = runCLI(t, url, "third from attach\n/end\n", "attach", "cli-s", "--raw")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "hello session")
	require.Contains(t, out, "second turn")
	require.Contains(t, out, "third from attach")
	final := sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, protocol.StateSucceeded, final.State)
	require.Equal(t, 3, final.Turn)
}

// TestStandinSessionParksOnWorkerStop: a worker that stops parks its idle
// session at once (not after its shutdown grace), and the next input
// resumes it on another worker with the turn count going on.
func TestStandinSessionParksOnWorkerStop(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Grace: 10 * time.Minute})
	fleettest.WaitReady(t, a.W)
	sw := watchStatus(t, f, "default", "st-stop")
	submitSession(t, f, "default", "st-stop", "before the stop", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, a.W.Stop(ctx), "the stop does not wait out the 10-minute grace")
	sw.state(protocol.StateParked, 1)

	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sendCtl(t, f, "default", "st-stop", input("after the stop"))
	sw.state(protocol.StateIdle, 2)
	sendCtl(t, f, "default", "st-stop", protocol.CtlOp{Op: protocol.OpEnd})
	r := f.Follow("default", "st-stop", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 2, r.Final.Turn)
	last := string(r.Lines[len(r.Lines)-2].Data)
	require.Contains(t, last, "after the stop")
	require.Contains(t, last, "(1 earlier messages in this session)", "the resumed stand-in found the session's transcript")
}

// TestParkedSessionExpires: a session parked longer than --session-ttl ends
// with one succeeded status, and its transcript is assembled.
func TestParkedSessionExpires(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{SessionTTL: time.Second, SessionSweep: 100 * time.Millisecond})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "st-ttl")
	one := 1
	submitSession(t, f, "default", "st-ttl", "short-lived", &protocol.Session{IdleTimeoutS: &one}, protocol.Options{})
	sw.state(protocol.StateParked, 1)
	final := sw.waitFor("terminal", func(ev protocol.StatusEvent) bool { return ev.State.Terminal() })
	require.Equal(t, protocol.StateSucceeded, final.State)
	require.Equal(t, 1, final.Turn)
	tr := f.Transcript(f.Objects, "default", "st-ttl")
	require.Contains(t, string(tr), "short-lived")
	r := f.Follow("default", "st-ttl", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, 1, terminalCount(sw.all()))
}
