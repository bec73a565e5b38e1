package dashboard

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/discovery"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// screenshot saves the page as name.png in the test's artifact directory
// (go test -artifacts -outputdir DIR keeps it; else a temporary one).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var png []byte
	require.NoError(t, chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100))) // 100: a PNG
	p := filepath.Join(t.ArtifactDir(), name+".png")
	require.NoError(t, os.WriteFile(p, png, 0o644))
	t.Logf("screenshot: %s", p)
}

// evalInt evaluates js in the page, 0 while the page is between loads.
func evalInt(ctx context.Context, js string) int {
	var n int
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &n)); err != nil {
		return 0
	}
	return n
}

// The fleet page in a real browser: its charts draw the jobs that ended
// (a canvas per chart, with the data), a worker started after the page
// opened appears without a reload, and the query list finds a job by its
// metadata and by part of its id.
func TestBrowserFleetChartsLiveWorkersAndSearch(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	ctx := browser(t)
	jobs := map[string]string{"chart-1": "build-alpha", "chart-2": "build-beta", "chart-3": "build-gamma", "chart-4": "broken"}
	for id, build := range jobs {
		prompt := "/standin lines=2"
		if build == "broken" {
			prompt = "/standin error=1"
		}
		c, cancel := context.WithTimeout(context.Background(), wait)
		r, err := b.f.Client.Submit(c, protocol.Job{ID: id, Prompt: prompt, Metadata: map[string]string{"build": build}})
		cancel()
		require.NoError(t, err)
		require.Nil(t, r.Error)
	}
	for id := range jobs {
		b.f.Follow("default", id, wait)
	}
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/"),
		chromedp.WaitVisible("#chart-jobs canvas", chromedp.ByQuery),
		chromedp.Evaluate(`window.fleetMarker = "same page"`, nil),
	))
	ended := `(function(){var c=window.fleetCharts&&window.fleetCharts["chart-jobs"];` +
		`return c?c.plot.data[1].reduce(function(a,b){return a+b},0):0})()`
	fleettest.Eventually(t, wait, func() bool { return evalInt(ctx, ended) >= len(jobs) }, "the jobs chart counts the ended jobs")
	failed := strings.Replace(ended, "data[1]", "data[2]", 1)
	fleettest.Eventually(t, wait, func() bool { return evalInt(ctx, failed) == 1 }, "the jobs chart counts the failed job")
	fleettest.Eventually(t, wait, func() bool {
		return strings.Contains(pageText(ctx, "failures"), "default/chart-4")
	}, "the failure is listed")
	for _, id := range []string{"chart-spend", "chart-queue", "chart-wait"} {
		fleettest.Eventually(t, wait, func() bool {
			return evalInt(ctx, `document.querySelectorAll("#`+id+` canvas").length`) == 1
		}, id+" is drawn")
	}
	tenants := `(function(){var c=window.fleetCharts["chart-spend"];return c?c.plot.data[0].length:0})()`
	require.Equal(t, 1, evalInt(ctx, tenants), "one tenant's spend")
	screenshot(t, ctx, "fleet")

	// A worker that starts now appears on the open page.
	w2 := b.f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w2.W)
	svc, err := discovery.ServeWorker(w2.NC, b.f.Names, discovery.Worker{ID: w2.W.ID(), Info: w2.W.Info, Drain: func() {}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	fleettest.Eventually(t, wait, func() bool {
		return strings.Contains(pageText(ctx, "workers"), w2.W.ID())
	}, "the new worker appears without a reload")
	var marker string
	require.NoError(t, chromedp.Run(ctx, chromedp.Evaluate(`window.fleetMarker`, &marker)))
	require.Equal(t, "same page", marker, "no reload")
	screenshot(t, ctx, "fleet-new-worker")

	// Search: by metadata value (any case), and by part of an id. A click
	// that loads a page is followed by reading the page in one step inside
	// it (pageText), never by a node of the page it left.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/queries"),
		chromedp.WaitVisible("#q", chromedp.ByID),
		chromedp.SendKeys("#q", "BUILD-BETA", chromedp.ByID),
		chromedp.Click("#search", chromedp.ByID),
	))
	var list string
	fleettest.Eventually(t, wait, func() bool {
		list = pageText(ctx, "queries")
		return strings.Contains(list, "default/chart-2") && !strings.Contains(list, "chart-1")
	}, "the search finds chart-2 by its metadata")
	require.Contains(t, list, "build=build-beta")
	require.NotContains(t, list, "chart-3")
	screenshot(t, ctx, "search")

	// Pages of the index (two a page here), tenant then id.
	require.NoError(t, chromedp.Run(ctx,
		chromedp.Navigate(b.srv.URL+"/queries"),
		chromedp.WaitVisible("#next", chromedp.ByID),
	))
	list = pageText(ctx, "queries")
	require.Contains(t, list, "default/chart-1")
	require.Contains(t, list, "default/chart-2")
	require.NotContains(t, list, "chart-3")
	require.NoError(t, chromedp.Run(ctx, chromedp.Click("#next", chromedp.ByID)))
	fleettest.Eventually(t, wait, func() bool {
		next := pageText(ctx, "queries")
		return strings.Contains(next, "default/chart-3") && !strings.Contains(next, "chart-1")
	}, "the next page holds the next records")

	require.NoError(t, chromedp.Run(ctx, chromedp.Navigate(b.srv.URL+"/queries?q=rt-3")))
	list = pageText(ctx, "queries")
	require.Contains(t, list, "default/chart-3")
	require.NotContains(t, list, "chart-2")
}
