package sandbox_test

import (
	"bufio"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/sandbox/sandboxtest"
)

// BenchmarkContainedFirstLine measures spawn to first stdout line, contained
// beside none in the same run (alternating, so both see the same machine),
// and reports p50 and p99 of each and the p50 difference (the target of
// docs/contained.md:
// contained at most 15 ms above none).
func BenchmarkContainedFirstLine(b *testing.B) {
	if err := sandbox.CheckContained(); err != nil {
		b.Skipf("contained sandboxes cannot run here: %v", err)
	}
	none := benchLocal(b, sandbox.IsolationNone)
	cont := benchLocal(b, sandbox.IsolationContained)
	var dn, dc []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		dn = append(dn, firstLine(b, none, i))
		dc = append(dc, firstLine(b, cont, i))
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) float64 {
		slices.Sort(d)
		p50 := ms(d[len(d)/2])
		p99 := ms(d[min(len(d)-1, len(d)*99/100)])
		b.ReportMetric(p50, name+"_first_line_p50_ms")
		b.ReportMetric(p99, name+"_first_line_p99_ms")
		fmt.Printf("%s_first_line_p50_ms %.2f\n%s_first_line_p99_ms %.2f\n", name, p50, name, p99)
		return p50
	}
	pn, pc := report("none", dn), report("contained", dc)
	b.ReportMetric(pc-pn, "contained_extra_p50_ms")
	fmt.Printf("contained_extra_p50_ms %.2f\n", pc-pn)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func benchLocal(b *testing.B, iso string) sandbox.Sandbox {
	l, err := sandbox.NewLocal(sandbox.LocalConfig{Root: b.TempDir(), Isolation: iso})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	sb, err := l.Create(b.Context(), sandbox.Spec{ID: "bench-" + iso})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sb.Destroy(b.Context()) })
	return sb
}

func firstLine(b *testing.B, sb sandbox.Sandbox, i int) time.Duration {
	start := time.Now()
	p, err := sb.Start(b.Context(), sandbox.ProcSpec{ID: "p" + strconv.Itoa(i), Argv: sandboxtest.ChildArgv("echo first")})
	if err != nil {
		b.Fatal(err)
	}
	br := bufio.NewReader(p.Stdout())
	if _, err := br.ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if _, err := br.WriteTo(discard{}); err != nil {
		b.Fatal(err)
	}
	if _, err := p.Wait(b.Context()); err != nil {
		b.Fatal(err)
	}
	return d
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
