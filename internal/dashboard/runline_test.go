package dashboard

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// The query page's run timeline in a real browser: a turn, a tool call
// with how long it took, and a model call the gateway metered (its .model
// event) with its duration and cost, and the run's totals.
func TestBrowserRunTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	ctx := browser(t)
	submit(t, b.f, "run-1", "/standin sleep=10m")
	fleettest.Eventually(t, wait, func() bool {
		st, err := b.f.Client.Status(context.Background(), protocol.QueryRef{ID: "run-1"})
		return err == nil && st.Status != nil && st.Status.State == protocol.StateRunning
	}, "run-1 runs")
	pub := func(subject, data string, seq int) {
		t.Helper()
		m := &nats.Msg{Subject: subject, Data: []byte(data), Header: nats.Header{}}
		if seq > 0 {
			m.Header.Set(protocol.HeaderSeq, strings.Repeat("9", seq))
		}
		c, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		_, err := b.f.JS.PublishMsg(c, m)
		require.NoError(t, err)
	}
	msg := b.f.Names.QueryMsg("default", "run-1")
	pub(b.f.Names.QueryModel("default", "run-1"), `{"call":1,"attempt":1,"model":"claude-test","input_tokens":10,"output_tokens":5,"cost_usd":0.0125,"status":200,"ms":1234}`, 0)
	pub(msg, `{"type":"assistant","message":{"id":"msg_1","role":"assistant","content":[{"type":"tool_use","id":"tu_1","name":"Bash","input":{"command":"ls"}}]}}`, 6)
	pub(msg, `{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":"a.go"}]}}`, 7)

	var runline, stats string
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/run-1"),
		chromedp.WaitVisible("#runline .run-tool .took", chromedp.ByQuery),
		chromedp.WaitVisible("#runline .run-model", chromedp.ByQuery),
		chromedp.Text("#runline", &runline, chromedp.ByID),
		chromedp.Text("#runstats", &stats, chromedp.ByID),
	))
	require.Contains(t, runline, "turn 1")
	require.Regexp(t, `tool Bash · \d+\.\d+s`, runline)
	require.Contains(t, runline, "model claude-test #1 · 10 in / 5 out · $0.0125 · 1.23s")
	// The stand-in's own turn may be stored before ours or after it.
	require.Regexp(t, `^[12] turns? · 1 tool calls · 1 model calls · 1\.23s in the model · \$0\.0125$`, stats)
	screenshot(t, ctx, "run-timeline")
	require.NoError(t, b.f.NC.Publish(b.f.Names.QueryCtl("default", "run-1"), []byte(`{"op":"cancel"}`)))
	b.f.Follow("default", "run-1", wait)
}

// Turns are the agent's turns, not its lines: a stand-in run of 41
// assistant lines in a row and a result reporting num_turns 1 shows one
// turn in the header and one turn row in the timeline. Before, each
// assistant line with a new message id counted as a turn ("41 turns").
func TestBrowserRunCountsTurnsNotLines(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	ctx := browser(t)
	submit(t, b.f, "many-lines", "/standin lines=40")
	r := b.f.Follow("default", "many-lines", wait)
	require.Equal(t, protocol.StateSucceeded, r.Final.State)
	var stats string
	var rows []*cdp.Node
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/q/default/many-lines"),
		chromedp.WaitVisible("#runline .run-result", chromedp.ByQuery),
		chromedp.Text("#runstats", &stats, chromedp.ByID),
		chromedp.Nodes("#runline .run-turn", &rows, chromedp.ByQueryAll),
	))
	require.Regexp(t, `^1 turn · `, stats)
	require.Len(t, rows, 1, "one turn row in the timeline")
}
