// Package gatewaybench measures what the model gateway adds to a model
// call: the time to the first streamed byte, through the gateway and
// straight to the same upstream (internal/anthropicfake) in the same run,
// and the CPU the gateway spends per call. pkg/gateway's
// BenchmarkGateway and internal/bench's BenchmarkGatewayLatency (make
// bench) print its Result.
package gatewaybench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/anthropicfake"
	"github.com/agentfleet/agentfleet/pkg/gateway"
)

// Result is one measurement.
type Result struct {
	Calls int
	// First-byte latencies: request sent to the first byte of the body.
	GatewayP50, GatewayP99, DirectP50, DirectP99 time.Duration
	// GatewayCPUPerCall is the process CPU (user + system) per call
	// through the gateway minus that per direct call: the gateway's share.
	GatewayCPUPerCall time.Duration
}

// body is a small streaming conversation request, as Claude Code sends.
const body = `{"model":"claude-sonnet-5-5","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"Bash","input_schema":{"type":"object"}}]}`

// Measure makes calls calls each way (after a warm-up), in alternating
// blocks so that both ways see the same machine.
func Measure(tb testing.TB, calls int) Result {
	tb.Helper()
	fake := anthropicfake.New(tb, func(*anthropicfake.Request) anthropicfake.Reply {
		return anthropicfake.Reply{Blocks: []anthropicfake.Block{anthropicfake.Text("ok")},
			Usage: &anthropicfake.Usage{InputTokens: 100, OutputTokens: 10}}
	})
	gw, err := gateway.Start(gateway.Config{Upstream: fake.URL, APIKey: "sk-ant-bench-key",
		Publisher: gateway.PublisherFunc(func(gateway.RunInfo, gateway.Event) {})})
	if err != nil {
		tb.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	client := &http.Client{Transport: tr}
	defer func() {
		tr.CloseIdleConnections()
		_ = gw.Stop(context.Background())
	}()
	token, base := gw.Open(gateway.RunInfo{Tenant: "bench", QueryID: "q", Attempt: 1})
	defer gw.Close(token)

	const block = 50
	var direct, through []time.Duration
	var directCPU, throughCPU time.Duration
	for _, warm := range []bool{true, false} {
		n := calls
		if warm {
			n = min(calls, block)
		}
		for done := 0; done < n; done += block {
			k := min(block, n-done)
			d, c := run(tb, client, fake.URL, "sk-ant-fake", k)
			g, cg := run(tb, client, base, token, k)
			if !warm {
				direct, through = append(direct, d...), append(through, g...)
				directCPU, throughCPU = directCPU+c, throughCPU+cg
			}
		}
	}
	slices.Sort(direct)
	slices.Sort(through)
	return Result{
		Calls: calls, GatewayP50: pct(through, 50), GatewayP99: pct(through, 99),
		DirectP50: pct(direct, 50), DirectP99: pct(direct, 99),
		GatewayCPUPerCall: (throughCPU - directCPU) / time.Duration(calls),
	}
}

// run makes n calls to base and returns each one's first-byte latency and
// the process CPU they took.
func run(tb testing.TB, client *http.Client, base, key string, n int) ([]time.Duration, time.Duration) {
	out := make([]time.Duration, 0, n)
	cpu0 := cpuTime()
	buf := make([]byte, 32<<10)
	for range n {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := resp.Body.Read(buf); err != nil && !errors.Is(err, io.EOF) {
			tb.Fatal(err)
		}
		out = append(out, time.Since(start))
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			tb.Fatalf("status %d", resp.StatusCode)
		}
	}
	return out, cpuTime() - cpu0
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, (len(sorted)*p+99)/100-1)]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
