package bench

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/worker"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// admissionSizes are the admission benchmarks' workloads.
type admissionSizes struct {
	overheadJobs, backlog, slots int
}

var fullAdmission = admissionSizes{overheadJobs: 200, backlog: 10_000, slots: 4}

// admissionOverhead measures submit to run start on an idle worker, for
// jobs that go through admission (published on <prefix>.jobs.<tenant>)
// and, alternating in the same run, for jobs published straight where the
// workers pull (<prefix>.work.<tenant>: the path before admission existed).
func admissionOverhead(t testing.TB, sz admissionSizes) (with, without []time.Duration) {
	var mu sync.Mutex
	started := map[string]chan struct{}{}
	f := fleettest.New(t, fleettest.Opts{})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1, Mod: func(c *worker.Config) {
		c.Test.RunStarted = func(_, id string, _ int) {
			mu.Lock()
			ch := started[id]
			mu.Unlock()
			if ch != nil {
				close(ch)
			}
		}
	}})
	fleettest.WaitReady(t, w.W)
	done, stop := terminalWatcher(t, f.NC, f.Names)
	defer stop()
	ctx := context.Background()
	for i := range 2 * sz.overheadJobs {
		id := "ov" + strconv.Itoa(i)
		ch := make(chan struct{})
		mu.Lock()
		started[id] = ch
		mu.Unlock()
		body, err := json.Marshal(protocol.Job{ID: id, Prompt: "hi"})
		require.NoError(t, err)
		subject := f.Names.JobSubject("default")
		if i%2 == 1 {
			subject = f.Names.WorkSubject("default")
		}
		m := nats.NewMsg(subject)
		m.Data = body
		m.Header.Set(protocol.HeaderMsgID, id)
		t0 := time.Now()
		_, err = f.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("job %s did not start", id)
		}
		if i%2 == 1 {
			without = append(without, time.Since(t0))
		} else {
			with = append(with, time.Since(t0))
		}
		waitTerminal(t, done, 1, time.Minute) // idle again before the next
	}
	return with, without
}

// fairFirstStart queues backlog jobs of one tenant, lets them run on
// slots slots, then submits one job of another tenant and counts the
// backlogged tenant's runs that start between that submit and the other
// tenant's first start (goal: at most the slot count).
func fairFirstStart(t testing.TB, sz admissionSizes) int {
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: sz.slots})
	js, err := jetstream.New(f.NC, jetstream.WithPublishAsyncMaxPending(1024))
	require.NoError(t, err)
	for i := range sz.backlog {
		b, _ := json.Marshal(protocol.Job{ID: "big" + strconv.Itoa(i), Prompt: "hi"})
		for {
			if _, err = js.PublishAsync(f.Names.JobSubject("big"), b); err == nil {
				break
			}
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	type start struct{ tenant string }
	starts := make(chan start, 1<<16)
	sub, err := f.NC.Subscribe(f.Names.StatusWildcard(), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.State == protocol.StateRunning {
			starts <- start{ev.Tenant}
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, f.NC.Flush())
	w := f.StartWorker(fleettest.WorkerOpts{Slots: sz.slots})
	fleettest.WaitReady(t, w.W)
	for range 2 * sz.slots { // the backlog flows
		<-starts
	}
	for len(starts) > 0 {
		<-starts
	}
	f.SubmitJSON("small", "small-1", "hi")
	n := 0
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case s := <-starts:
			if s.tenant == "small" {
				return n
			}
			n++
		case <-timeout:
			t.Fatal("the small tenant's job never started")
		}
	}
}

func BenchmarkFleetAdmission(b *testing.B) {
	b.Run("overhead", func(b *testing.B) {
		with, without := admissionOverhead(b, fullAdmission)
		w50, w99 := percentile(with, 0.50), percentile(with, 0.99)
		o50, o99 := percentile(without, 0.50), percentile(without, 0.99)
		figure("admission_overhead_ms_p50", w50-o50, "ms")
		figure("admission_overhead_ms_p99", w99-o99, "ms")
		figure("submit_to_start_admitted_p50_ms", w50, "ms")
		figure("submit_to_start_admitted_p99_ms", w99, "ms")
		figure("submit_to_start_direct_p50_ms", o50, "ms")
		figure("submit_to_start_direct_p99_ms", o99, "ms")
		figure("admission_overhead_p50_ratio", w50/o50, "ratio")
	})
	b.Run("fair", func(b *testing.B) {
		n := fairFirstStart(b, fullAdmission)
		figure("fair_first_start_slots", float64(n), "runs")
		figure("fair_first_start_slot_count", float64(fullAdmission.slots), "slots")
	})
}

// TestAdmissionBenchmarksRun runs the admission benchmarks at a tiny size
// so they cannot rot; it asserts they complete, never their speed.
func TestAdmissionBenchmarksRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole fleet twice; skipped with -short")
	}
	tiny := admissionSizes{overheadJobs: 3, backlog: 40, slots: 2}
	with, without := admissionOverhead(t, tiny)
	require.Len(t, with, 3)
	require.Len(t, without, 3)
	require.LessOrEqual(t, fairFirstStart(t, tiny), 2*tiny.slots)
}
