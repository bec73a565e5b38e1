package gateway_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/internal/gatewaybench"
)

// BenchmarkGateway reports the gateway's first-byte latency (p50, p99)
// beside the same calls made straight to the upstream, and its CPU per
// call. go test -run '^$' -bench BenchmarkGateway ./pkg/gateway/
func BenchmarkGateway(b *testing.B) {
	r := gatewaybench.Measure(b, max(b.N, 200))
	ms := func(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1000 }
	b.ReportMetric(ms(r.GatewayP50), "gw_p50_ms")
	b.ReportMetric(ms(r.GatewayP99), "gw_p99_ms")
	b.ReportMetric(ms(r.DirectP50), "direct_p50_ms")
	b.ReportMetric(ms(r.DirectP99), "direct_p99_ms")
	b.ReportMetric(float64(r.GatewayCPUPerCall.Microseconds()), "gw_cpu_us/call")
	b.ReportMetric(0, "ns/op")
}
