package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// watchedBuffer is a writer whose content a test can wait on.
type watchedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{}
}

func newWatchedBuffer() *watchedBuffer { return &watchedBuffer{ch: make(chan struct{}, 1)} }

func (b *watchedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case b.ch <- struct{}{}:
	default:
	}
	return b.buf.Write(p)
}

func (b *watchedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitCount waits until s occurs at least n times.
func (b *watchedBuffer) waitCount(t *testing.T, s string, n int) string {
	t.Helper()
	deadline := time.After(wait)
	for {
		if got := b.String(); strings.Count(got, s) >= n {
			return got
		}
		select {
		case <-b.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %d× %q in:\n%s", n, s, b.String())
		}
	}
}

// TestAttachPromptsForApprovals drives `dispatcher attach` through pipes
// against a session with remote approvals: the agent asks for two tools at
// once, attach prompts for the oldest (tool, input, request id, how many
// more wait), "y" allows it and the next is prompted, "n <why>" denies that
// one with the message, and the agent gets exactly those answers; typed
// lines that are no answer stay inputs.
func TestAttachPromptsForApprovals(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 1}).W)
	sw := watchStatus(t, f, "default", "att-1")
	idleS := 600
	submitSession(t, f, "default", "att-1", "first turn", &protocol.Session{IdleTimeoutS: &idleS, Approvals: protocol.ApprovalsRemote}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)

	inR, inW := io.Pipe()
	out, errOut := newWatchedBuffer(), newWatchedBuffer()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- fleetcli.Run(ctx, []string{"attach", "att-1", "--raw", "--nats-url", f.Srv.ClientURL()},
			fleetcli.IO{In: inR, Out: out, Err: errOut})
	}()
	typeLine := func(s string) {
		_, err := io.WriteString(inW, s+"\n")
		require.NoError(t, err)
	}
	out.waitCount(t, "first turn", 1) // the history is shown

	// "y" with no request waiting is an input like any other.
	typeLine("y")
	sw.state(protocol.StateIdle, 2)

	typeLine("/standin ask=Bash,Write")
	errOut.waitCount(t, "(queued: permission request", 1)
	got := errOut.waitCount(t, `{"command":"stand-in use of Bash"}`, 1)
	// The prompt names the request and the tool; the tool's input is on it,
	// or on the line after when the status came before the request's line.
	require.Regexp(t, `(?s)\? permission request standin-req-\S+: the agent wants to use Bash( \{"command":"stand-in use of Bash"\}|\n.*  Bash input: \{"command":"stand-in use of Bash"\})`, got)
	require.Contains(t, got, "allow? [y / n [message]]")
	require.Regexp(t, `\(queued: permission request standin-req-\S+ for Write; answer the one above first\)`, got)
	sw.waitFor("awaiting_approval", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateAwaitingApproval && ev.ToolName == "Bash"
	})

	typeLine("y")
	got = errOut.waitCount(t, "? permission request", 2)
	require.Regexp(t, `\? permission request standin-req-\S+: the agent wants to use Write`, got[strings.LastIndex(got, "? permission"):])

	typeLine("n not on main")
	sw.state(protocol.StateIdle, 3)
	require.Contains(t, out.waitCount(t, "permissions:", 1), "permissions: Bash allow; Write deny: not on main")
	require.Equal(t, 2, strings.Count(errOut.String(), "? permission request"), "each request is prompted once")

	typeLine("/end")
	select {
	case code := <-done:
		require.Equal(t, fleetcli.ExitOK, code, errOut.String())
	case <-time.After(wait):
		t.Fatal("attach did not exit after the session ended")
	}
	_ = inW.Close()
	r := f.Follow("default", "att-1", wait)
	fleettest.RequireContiguous(t, r)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	require.Equal(t, 3, r.Final.Turn)
}
