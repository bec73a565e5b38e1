package dashboard

import (
	"context"
	"strings"
	"testing"

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
	// The stand-in wrote a turn of its own before ours.
	require.Regexp(t, `^\d+ turns · 1 tool calls · 1 model calls · 1\.23s in the model · \$0\.0125$`, stats)
	screenshot(t, ctx, "run-timeline")
	require.NoError(t, b.f.NC.Publish(b.f.Names.QueryCtl("default", "run-1"), []byte(`{"op":"cancel"}`)))
	b.f.Follow("default", "run-1", wait)
}
