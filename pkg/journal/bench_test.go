package journal

import (
	"context"
	"testing"
)

// BenchmarkAppend measures Append of 1 KiB lines under the default fsync
// policy (FsyncInterval) while the flusher persists to an in-memory store.
func BenchmarkAppend(b *testing.B) {
	// The flusher reads every chunk back and puts it to a store that drops
	// it, so memory does not grow with b.N.
	discard := storeFunc(func(context.Context, string, []byte) error { return nil })
	cfg := Config{Dir: b.TempDir(), Store: discard}
	j, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := j.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	l, err := j.Open("acme", "bench", 1)
	if err != nil {
		b.Fatal(err)
	}
	ln := line(1, 1024)
	b.SetBytes(int64(len(ln)))
	b.ReportAllocs()
	seq := uint64(0)
	for b.Loop() {
		seq++
		if err := l.Append(seq, ln); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "lines/s")
	_ = l.Close(false)
	if err := j.Stop(b.Context()); err != nil {
		b.Fatal(err)
	}
}
