package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/agent"
	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/session"
)

// sessionFigures are the session benchmark's results, in milliseconds.
type sessionFigures struct {
	inputP50, inputP99, resumeP50, spawnP50 float64
}

// sessions measures, with the stand-in agent: an input published on .ctl to
// the first line of its turn relayed (input_to_first_line, a live idle
// session), an input to a parked session to the first line of its turn
// (resume: continuation job, checkpoint restored, a new process), and the
// baseline: spawning the same agent bare and reading its first line.
func sessions(t testing.TB, inputs, resumes int) sessionFigures {
	bin := standin(t)
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2, AgentMod: func(c *agent.Config) { c.Command = bin }})
	fleettest.WaitReady(t, w.W)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	type watch struct {
		lines  chan uint64
		status chan protocol.StatusEvent
	}
	follow := func(id string) watch {
		wt := watch{lines: make(chan uint64, 4096), status: make(chan protocol.StatusEvent, 4096)}
		ms, err := f.NC.Subscribe(f.Names.QueryMsg("default", id), func(m *nats.Msg) {
			seq, _ := strconv.ParseUint(m.Header.Get(protocol.HeaderSeq), 10, 64)
			wt.lines <- seq
		})
		require.NoError(t, err)
		ss, err := f.NC.Subscribe(f.Names.QueryStatus("default", id), func(m *nats.Msg) {
			var ev protocol.StatusEvent
			if json.Unmarshal(m.Data, &ev) == nil {
				wt.status <- ev
			}
		})
		require.NoError(t, err)
		require.NoError(t, f.NC.Flush())
		t.Cleanup(func() { _ = ms.Unsubscribe(); _ = ss.Unsubscribe() })
		return wt
	}
	untilState := func(wt watch, s protocol.State) {
		for {
			select {
			case ev := <-wt.status:
				if ev.State == s {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %s status", s)
			}
		}
	}
	// firstLineAfter publishes an input and waits for a line past seq.
	firstLineAfter := func(wt watch, id string, seq *uint64, text string) time.Duration {
		b, _ := json.Marshal(protocol.CtlOp{Op: protocol.OpInput, SessionOp: protocol.SessionOp{Text: text}})
		t0 := time.Now()
		_, err := f.JS.Publish(ctx, f.Names.QueryCtl("default", id), b)
		require.NoError(t, err)
		for {
			select {
			case s := <-wt.lines:
				if s > *seq {
					d := time.Since(t0)
					*seq = s
					for len(wt.lines) > 0 { // the rest of the turn's lines
						*seq = max(*seq, <-wt.lines)
					}
					return d
				}
			case <-ctx.Done():
				t.Fatal("no line after the input")
			}
		}
	}
	drain := func(wt watch, seq *uint64) {
		for len(wt.lines) > 0 {
			*seq = max(*seq, <-wt.lines)
		}
	}
	submit := func(id string, idle int) {
		b, _ := json.Marshal(protocol.Job{ID: id, Prompt: "hi", Session: &protocol.Session{IdleTimeoutS: &idle}})
		f.PublishJob("default", b, nil)
	}

	var fig sessionFigures
	live := follow("bs-live")
	submit("bs-live", 600)
	untilState(live, protocol.StateIdle)
	var seq uint64
	drain(live, &seq)
	var in []time.Duration
	for i := range inputs {
		in = append(in, firstLineAfter(live, "bs-live", &seq, "input "+strconv.Itoa(i)))
		untilState(live, protocol.StateIdle)
		drain(live, &seq)
	}
	fig.inputP50, fig.inputP99 = percentile(in, 0.5), percentile(in, 0.99)
	end, _ := json.Marshal(protocol.CtlOp{Op: protocol.OpEnd})
	_, err := f.JS.Publish(ctx, f.Names.QueryCtl("default", "bs-live"), end)
	require.NoError(t, err)
	untilState(live, protocol.StateSucceeded)

	parked := follow("bs-park")
	submit("bs-park", 1)
	seq = 0
	var res []time.Duration
	for i := range resumes {
		untilState(parked, protocol.StateParked)
		drain(parked, &seq)
		res = append(res, firstLineAfter(parked, "bs-park", &seq, "resume "+strconv.Itoa(i)))
	}
	untilState(parked, protocol.StateParked)
	fig.resumeP50 = percentile(res, 0.5)

	// Baseline: the same agent program spawned bare with a session's argv
	// (the worker's: agent.BaseArgs and session.InputArgs), its first user
	// message written, its first line read.
	argv := append(agentArgv(bin), session.InputArgs...)
	first, err := json.Marshal(map[string]any{"type": "user", "message": map[string]any{"role": "user", "content": "hi"}})
	require.NoError(t, err)
	var spawn []time.Duration
	for range max(inputs, resumes) {
		t0 := time.Now()
		cmd := exec.Command(argv[0], argv[1:]...)
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		_, err = stdin.Write(append(first, '\n'))
		require.NoError(t, err)
		_, err = bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		spawn = append(spawn, time.Since(t0))
		_ = stdin.Close()
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}
	fig.spawnP50 = percentile(spawn, 0.5)
	return fig
}

func reportSessions(fig sessionFigures) {
	figure("input_to_first_line_p50_ms", fig.inputP50, "ms")
	figure("input_to_first_line_p99_ms", fig.inputP99, "ms")
	figure("resume_p50_ms", fig.resumeP50, "ms")
	figure("session_baseline_spawn_first_line_p50_ms", fig.spawnP50, "ms")
	figure("input_to_first_line_ratio", fig.inputP50/fig.spawnP50, "ratio")
	figure("resume_ratio", fig.resumeP50/fig.spawnP50, "ratio")
}

func BenchmarkFleetSessions(b *testing.B) {
	reportSessions(sessions(b, 50, 5))
}

// TestSessionBenchmarkRuns runs the session benchmark at a tiny size so it
// cannot rot; it asserts sane figures, never speed.
func TestSessionBenchmarkRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole fleet; skipped with -short")
	}
	fig := sessions(t, 3, 1)
	require.Positive(t, fig.inputP50)
	require.GreaterOrEqual(t, fig.inputP99, fig.inputP50)
	require.Positive(t, fig.resumeP50)
	require.Positive(t, fig.spawnP50)
}
