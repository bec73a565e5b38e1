package bench

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/gatewaybench"
)

// BenchmarkGatewayLatency is the model gateway's cost (docs/gateway.md): the time
// to the first streamed byte of a model call through the gateway and
// straight to the same fake upstream in the same run (p50, p99), their
// ratio, what the gateway adds at p99 (target: under 1 ms), and the CPU
// it spends per call.
func BenchmarkGatewayLatency(b *testing.B) {
	r := gatewaybench.Measure(b, 2000)
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
	figure("gateway_first_byte_p50_ms", ms(r.GatewayP50), "ms")
	figure("gateway_first_byte_p99_ms", ms(r.GatewayP99), "ms")
	figure("direct_first_byte_p50_ms", ms(r.DirectP50), "ms")
	figure("direct_first_byte_p99_ms", ms(r.DirectP99), "ms")
	figure("gateway_added_first_byte_p50_ms", ms(r.GatewayP50-r.DirectP50), "ms")
	figure("gateway_added_first_byte_p99_ms", ms(r.GatewayP99-r.DirectP99), "ms")
	figure("gateway_first_byte_p99_ratio", float64(r.GatewayP99)/float64(max(r.DirectP99, 1)), "x")
	figure("gateway_cpu_per_call_us", float64(r.GatewayCPUPerCall.Microseconds()), "us")
}
