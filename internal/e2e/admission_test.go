package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/fleetcli"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/natstest"
	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// statusLog records every status event in the order the server delivers
// them (one server: the order they were published in), so tests can count
// runs at once per tenant: a run holds its slot from its "running" to its
// terminal status, and a worker publishes the terminal status before it
// acks the job, so the next run's "running" always comes after it.
type statusLog struct {
	mu     sync.Mutex
	events []protocol.StatusEvent
	ch     chan protocol.StatusEvent
}

func watchStatuses(t *testing.T, nc *nats.Conn, names protocol.Names) *statusLog {
	t.Helper()
	l := &statusLog{ch: make(chan protocol.StatusEvent, 1<<16)}
	sub, err := nc.Subscribe(names.StatusWildcard(), func(m *nats.Msg) {
		var ev protocol.StatusEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
		select {
		case l.ch <- ev:
		default:
		}
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// waitFor waits for a status event matching ok.
func (l *statusLog) waitFor(t *testing.T, what string, ok func(protocol.StatusEvent) bool) protocol.StatusEvent {
	t.Helper()
	l.mu.Lock()
	seen := slices.Clone(l.events)
	l.mu.Unlock()
	for _, ev := range seen {
		if ok(ev) {
			return ev
		}
	}
	timeout := time.After(wait)
	for {
		select {
		case ev := <-l.ch:
			if ok(ev) {
				return ev
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// positionChurn lists the jobs that got two queued statuses with the same
// reason less than a second apart: a waiting job's new place is announced
// at most once a second (admission's positionEvery).
func (l *statusLog) positionChurn() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := map[string]protocol.StatusEvent{}
	var churn []string
	for _, ev := range l.events {
		if ev.State != protocol.StateQueued {
			continue
		}
		key := ev.Tenant + "/" + ev.ID
		if prev, ok := last[key]; ok && prev.Reason == ev.Reason && ev.At.Sub(prev.At) < time.Second {
			churn = append(churn, fmt.Sprintf("%s: %s/%d then %s/%d after %s", key, prev.Reason, prev.Position, ev.Reason, ev.Position, ev.At.Sub(prev.At)))
		}
		last[key] = ev
	}
	return churn
}

// peaks returns the most runs at once per tenant (a parked session holds
// no slot until it runs again), the number of "running" events per query (more than one without a retry is a run admitted twice)
// and the terminal events per query.
func (l *statusLog) peaks() (peak map[string]int, starts map[string]int, ends map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	peak, starts, ends = map[string]int{}, map[string]int{}, map[string]int{}
	cur := map[string]int{}
	live := map[string]bool{}
	for _, ev := range l.events {
		key := ev.Tenant + "/" + ev.ID
		switch {
		case ev.State == protocol.StateRunning:
			starts[key]++
			if !live[key] {
				live[key] = true
				cur[ev.Tenant]++
				peak[ev.Tenant] = max(peak[ev.Tenant], cur[ev.Tenant])
			}
		case ev.State.Terminal() || ev.State == protocol.StateParked:
			if ev.State.Terminal() {
				ends[key]++
			}
			if live[key] {
				live[key] = false
				cur[ev.Tenant]--
			}
		}
	}
	return peak, starts, ends
}

func setTenant(t *testing.T, f *fleettest.Fleet, tenant string, s admission.Settings) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ts, err := admission.OpenTenants(ctx, f.JS, f.Names, false)
	require.NoError(t, err)
	require.NoError(t, ts.Set(ctx, tenant, s))
	fleettest.Eventually(t, wait, func() bool {
		got, ok := f.Disp.Admitter().SettingsOf(tenant)
		return ok && got == s
	}, "the admitter sees the settings of "+tenant)
}

// A capped tenant never has more than its max_running at once, while the
// fleet has free slots that another tenant's jobs use.
func TestAdmissionTenantCap(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 6})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "capped", admission.Settings{MaxRunning: 2})
	const n = 10
	for i := range n {
		f.SubmitJSON("capped", "c"+strconv.Itoa(i), "/standin sleep=300ms")
	}
	for i := range 4 {
		f.SubmitJSON("free", "f"+strconv.Itoa(i), "/standin sleep=300ms")
	}
	// The capped tenant's waiting jobs say why.
	log.waitFor(t, "a queued status with reason tenant_cap", func(ev protocol.StatusEvent) bool {
		return ev.Tenant == "capped" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonTenantCap && ev.Position >= 1
	})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 6})
	fleettest.WaitReady(t, w.W)
	for i := range n {
		require.Equal(t, protocol.StateSucceeded, f.Follow("capped", "c"+strconv.Itoa(i), wait).Final.State)
	}
	for i := range 4 {
		require.Equal(t, protocol.StateSucceeded, f.Follow("free", "f"+strconv.Itoa(i), wait).Final.State)
	}
	peak, starts, _ := log.peaks()
	require.Equal(t, 2, peak["capped"], "the capped tenant reaches its cap and never exceeds it")
	require.Greater(t, peak["free"], 1, "the other tenant uses the free slots meanwhile")
	require.Empty(t, log.positionChurn(), "a waiting job's place is announced at most once a second")
	for k, c := range starts {
		require.Equal(t, 1, c, "%s ran once", k)
	}
}

// A run's end admits the next job of a capped tenant at once. The worker
// publishes the terminal status before it acks the work message, so the
// pass that status wakes can still count the run; the admitter looks
// again shortly instead of leaving the job to its next tick (here an
// hour, so only that recheck can admit the jobs after the first).
func TestAdmissionRunEndAdmitsNextJob(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{Admission: admission.Config{Tick: time.Hour}})
	setTenant(t, f, "capped", admission.Settings{MaxRunning: 1})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 2})
	fleettest.WaitReady(t, w.W)
	log := watchStatuses(t, f.NC, f.Names)
	const n = 6
	for i := range n {
		f.SubmitJSON("capped", "c"+strconv.Itoa(i), "hi")
	}
	for i := range n {
		require.Equal(t, protocol.StateSucceeded, f.Follow("capped", "c"+strconv.Itoa(i), wait).Final.State)
	}
	peak, starts, _ := log.peaks()
	require.Equal(t, 1, peak["capped"], "the tenant never runs more than its cap")
	for k, c := range starts {
		require.Equal(t, 1, c, "%s ran once", k)
	}
}

// A tenant with 10,000 queued jobs delays another tenant's first job by at
// most one slot turnover: no more than the slot count of its runs start
// between the other's submit and its first start.
func TestAdmissionFairFirstStart(t *testing.T) {
	t.Parallel()
	const slots = 2
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: slots})
	log := watchStatuses(t, f.NC, f.Names)
	big := 10000
	if testing.Short() {
		big = 1000
	}
	publishMany(t, f, "big", big, "/standin")
	w := f.StartWorker(fleettest.WorkerOpts{Slots: slots})
	fleettest.WaitReady(t, w.W)
	// Let the big tenant's runs flow, then the small tenant submits.
	log.waitFor(t, "the big tenant's 5th run ending", func(ev protocol.StatusEvent) bool {
		return ev.Tenant == "big" && ev.State == protocol.StateSucceeded && ev.ID == "b4"
	})
	log.mu.Lock()
	mark := len(log.events)
	log.mu.Unlock()
	f.SubmitJSON("small", "s0", "/standin")
	log.waitFor(t, "the small tenant's first run", func(ev protocol.StatusEvent) bool {
		return ev.Tenant == "small" && ev.State == protocol.StateRunning
	})
	log.mu.Lock()
	between := 0
	for _, ev := range log.events[mark:] {
		if ev.Tenant == "small" && ev.State == protocol.StateRunning {
			break
		}
		if ev.Tenant == "big" && ev.State == protocol.StateRunning {
			between++
		}
	}
	log.mu.Unlock()
	t.Logf("big tenant's runs started between the small tenant's submit and its first start: %d (slots %d)", between, slots)
	require.LessOrEqual(t, between, slots)
}

// publishMany publishes n jobs of tenant quickly (async publish, then wait
// for every ack).
func publishMany(t testing.TB, f *fleettest.Fleet, tenant string, n int, prompt string) {
	t.Helper()
	js, err := jetstream.New(f.NC, jetstream.WithPublishAsyncMaxPending(4096))
	require.NoError(t, err)
	prefix := tenant[:1]
	for i := range n {
		b, _ := json.Marshal(protocol.Job{ID: prefix + strconv.Itoa(i), Prompt: prompt})
		_, err := js.PublishAsync(f.Names.JobSubject(tenant), b)
		require.NoError(t, err)
		if i%1000 == 999 || i == n-1 {
			// In batches, so a loaded machine never stalls the publisher.
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(wait):
				t.Fatal("timed out publishing")
			}
		}
	}
}

// Weights 3:1 under backlog give about 3:1 starts (between 2:1 and 4:1).
func TestAdmissionWeights(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 1})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "heavy", admission.Settings{Weight: 3})
	setTenant(t, f, "light", admission.Settings{Weight: 1})
	publishMany(t, f, "heavy", 40, "/standin")
	publishMany(t, f, "light", 40, "/standin")
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 1})
	fleettest.WaitReady(t, w.W)
	const first = 25
	var counts map[string]int
	count := func() int {
		counts = map[string]int{}
		total := 0
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, ev := range log.events {
			if ev.State == protocol.StateRunning && total < first {
				counts[ev.Tenant]++
				total++
			}
		}
		return total
	}
	log.waitFor(t, "25 starts", func(protocol.StatusEvent) bool { return count() >= first })
	count()
	t.Logf("first %d starts: heavy %d, light %d", first, counts["heavy"], counts["light"])
	require.Positive(t, counts["light"])
	ratio := float64(counts["heavy"]) / float64(counts["light"])
	require.GreaterOrEqual(t, ratio, 2.0)
	require.LessOrEqual(t, ratio, 4.0)
}

// fakeClock is the admitter's injected clock.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *fakeClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// A tenant whose results' cost reaches its budget gets no new runs until
// the window rolls over.
func TestAdmissionBudget(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4, Admission: admission.Config{Now: clock.Now}})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "spender", admission.Settings{BudgetUSD: 1, BudgetWindow: admission.Duration(time.Hour)})
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 4})
	fleettest.WaitReady(t, w.W)
	for _, id := range []string{"p1", "p2"} {
		f.SubmitJSON("spender", id, "/standin cost=0.6")
		require.Equal(t, protocol.StateSucceeded, f.Follow("spender", id, wait).Final.State)
	}
	waitSpend(t, f, "spender", clock.Now(), time.Hour, 1.2)
	f.SubmitJSON("spender", "p3", "/standin cost=0.6")
	log.waitFor(t, "p3 queued for its budget", func(ev protocol.StatusEvent) bool {
		return ev.ID == "p3" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonBudget && ev.Position == 1
	})
	// Another tenant is not held by it.
	f.SubmitJSON("other", "o1", "/standin")
	require.Equal(t, protocol.StateSucceeded, f.Follow("other", "o1", wait).Final.State)
	_, starts, _ := log.peaks()
	require.Zero(t, starts["spender/p3"], "p3 did not start over budget")
	clock.Advance(time.Hour)
	require.Equal(t, protocol.StateSucceeded, f.Follow("spender", "p3", wait).Final.State, "the next window resumes admission")
}

// A run whose result reaches its tenant's budget stops the tenant's next
// job at once: the worker acks the job right after its terminal status,
// and the slot freed by that ack must not be given on the spend from
// before the result. Before, the next job started in the moment before the
// spend was recorded, and the budget was spent twice over (found by QA, in
// three tries of three).
func TestAdmissionBudgetCountsAResultAsItEnds(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "once", admission.Settings{MaxRunning: 1, BudgetUSD: 1, BudgetWindow: admission.Duration(time.Hour)})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 4}).W)
	for _, id := range []string{"b1", "b2", "b3"} {
		f.SubmitJSON("once", id, "/standin cost=1")
	}
	require.Equal(t, protocol.StateSucceeded, f.Follow("once", "b1", wait).Final.State)
	ev := log.waitFor(t, "b2 started or held for the budget", func(ev protocol.StatusEvent) bool {
		return ev.ID == "b2" && (ev.State == protocol.StateRunning || (ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonBudget))
	})
	require.Equal(t, protocol.StateQueued, ev.State, "b2 must not start once b1's result reached the budget")
	waitSpend(t, f, "once", time.Now(), time.Hour, 1)
	_, starts, _ := log.peaks()
	require.Zero(t, starts["once/b2"]+starts["once/b3"], "nothing ran past the budget")
}

func waitSpend(t *testing.T, f *fleettest.Fleet, tenant string, now time.Time, window time.Duration, atLeast float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := f.JS.KeyValue(ctx, f.Names.AdmissionBucket())
	require.NoError(t, err)
	key := "spend." + tenant + "." + strconv.FormatInt(admission.WindowStart(now, window).Unix(), 10)
	fleettest.Eventually(t, wait, func() bool {
		e, err := kv.Get(ctx, key)
		if err != nil {
			return false
		}
		v, _ := strconv.ParseFloat(string(e.Value()), 64)
		return v >= atLeast-1e-9
	}, "the spend recorded")
}

// A rejected rate_limit_event pauses its tenant until the reset time; the
// admitter learns it from the worker, not from every query line.
func TestAdmissionRateLimitPause(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4, Admission: admission.Config{Now: clock.Now}})
	log := watchStatuses(t, f.NC, f.Names)
	w := f.StartWorker(fleettest.WorkerOpts{Slots: 4})
	fleettest.WaitReady(t, w.W)
	reset := clock.Now().Add(time.Hour).Unix()
	f.SubmitJSON("limited", "r1", "/standin ratelimit="+strconv.FormatInt(reset, 10))
	require.Equal(t, protocol.StateSucceeded, f.Follow("limited", "r1", wait).Final.State)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kv, err := f.JS.KeyValue(ctx, f.Names.AdmissionBucket())
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool { _, err := kv.Get(ctx, "pause.limited"); return err == nil }, "the pause recorded")
	// The worker forwarded the line on fleet.ratelimit.limited: the
	// admitter does not listen to every query's lines (it used to, so the
	// leading dispatcher received the whole fleet's output).
	require.True(t, f.Disp.Admitting())
	require.Positive(t, f.Srv.GlobalAccount().Interest(f.Names.RateLimitSubject("limited")), "the admitter listens for forwarded rate limits")
	// Only FLEET_QUERIES itself takes r1's lines, as it takes its
	// artifacts, which nobody here subscribes to.
	acc := f.Srv.GlobalAccount()
	require.Equal(t, acc.Interest(f.Names.QueryArtifact("limited", "r1")), acc.Interest(f.Names.QueryMsg("limited", "r1")),
		"a core subscriber of every query line")
	f.SubmitJSON("limited", "r2", "/standin")
	log.waitFor(t, "r2 queued as rate limited", func(ev protocol.StatusEvent) bool {
		return ev.ID == "r2" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonRateLimited
	})
	f.SubmitJSON("unlimited", "u1", "/standin")
	require.Equal(t, protocol.StateSucceeded, f.Follow("unlimited", "u1", wait).Final.State)
	_, starts, _ := log.peaks()
	require.Zero(t, starts["limited/r2"], "r2 did not start while paused")
	clock.Advance(time.Hour + time.Second)
	require.Equal(t, protocol.StateSucceeded, f.Follow("limited", "r2", wait).Final.State, "admission resumes after the reset")
}

// The admitting dispatcher is SIGKILLed mid-stream; the standby takes over,
// and no job is lost, admitted twice, or over its tenant's cap.
func TestAdmissionFailover(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	const conc = 4
	// The caps are set before the child dispatcher starts, so it loads them.
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ts, err := admission.OpenTenants(ctx, js, protocol.NewNames(""), true)
	require.NoError(t, err)
	require.NoError(t, ts.Set(ctx, "ta", admission.Settings{MaxRunning: 2}))
	require.NoError(t, ts.Set(ctx, "tb", admission.Settings{MaxRunning: 1}))
	child := fleettest.StartDispatcherProcess(t, srv.ClientURL(), t.TempDir(), conc, 2*time.Second)
	child.Expect(t, "admitting")
	f := fleettest.New(t, fleettest.Opts{Server: srv, MaxConcurrency: conc, Admission: admission.Config{LeaseTTL: 2 * time.Second}})
	require.False(t, f.Disp.Admitting(), "the child process admits")
	log := watchStatuses(t, f.NC, f.Names)
	const n = 12
	for i := range n {
		f.SubmitJSON("ta", "a"+strconv.Itoa(i), "/standin sleep=100ms")
		f.SubmitJSON("tb", "b"+strconv.Itoa(i), "/standin sleep=100ms")
	}
	w := f.StartWorker(fleettest.WorkerOpts{Slots: conc})
	fleettest.WaitReady(t, w.W)
	log.waitFor(t, "a few runs", func(ev protocol.StatusEvent) bool {
		return ev.State == protocol.StateSucceeded && (ev.ID == "a2" || ev.ID == "b2")
	})
	killed := time.Now()
	child.Kill(t)
	fleettest.Eventually(t, wait, f.Disp.Admitting, "the standby takes over")
	t.Logf("takeover %v after the SIGKILL", time.Since(killed).Round(time.Millisecond))
	for i := range n {
		for _, id := range []string{"a" + strconv.Itoa(i), "b" + strconv.Itoa(i)} {
			tenant := "t" + id[:1]
			require.Equal(t, protocol.StateSucceeded, f.Follow(tenant, id, wait).Final.State, id)
		}
	}
	// The log (a core subscription) may trail Follow by a moment.
	log.waitFor(t, "every terminal status in the log", func(protocol.StatusEvent) bool {
		_, _, ends := log.peaks()
		return len(ends) == 2*n
	})
	peak, starts, ends := log.peaks()
	require.LessOrEqual(t, peak["ta"], 2)
	require.LessOrEqual(t, peak["tb"], 1)
	require.Len(t, starts, 2*n)
	for k, c := range starts {
		require.Equal(t, 1, c, "%s admitted and run once", k)
		require.Equal(t, 1, ends[k], "%s ended once (%d terminal statuses)", k, ends[k])
	}
	// Every submission left the queue (purged after its pass, by either
	// admitter): none waits on fleet.jobs.<tenant> to be counted again.
	jobs, err := f.JS.Stream(ctx, f.Names.JobsStream())
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		info, err := jobs.Info(ctx, jetstream.WithSubjectFilter(f.Names.JobsWildcard()))
		return err == nil && len(info.State.Subjects) == 0
	}, "the admitted submissions removed from the queue")
}

// A live session counts against its tenant's cap, a parked one does not,
// and its continuation counts again once resumed: with max_running 1, a
// one-shot job waits (tenant_cap) behind an idle session, runs once the
// session is parked, and the next one waits again while the resumed
// session is live.
func TestAdmissionSessionCountsWhileLive(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "sess", admission.Settings{MaxRunning: 1})
	a := f.StartWorker(fleettest.WorkerOpts{Slots: 4, Grace: 10 * time.Minute})
	fleettest.WaitReady(t, a.W)
	sw := watchStatus(t, f, "sess", "s1")
	submitSession(t, f, "sess", "s1", "hold the slot", &protocol.Session{}, protocol.Options{})
	sw.state(protocol.StateIdle, 1)

	f.SubmitJSON("sess", "j1", "/standin lines=2")
	log.waitFor(t, "j1 waiting behind the live session (tenant_cap)", func(ev protocol.StatusEvent) bool {
		return ev.ID == "j1" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonTenantCap
	})

	// Park the session (its worker stops); the waiting job runs.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, a.W.Stop(ctx))
	sw.state(protocol.StateParked, 1)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 4}).W)
	require.Equal(t, protocol.StateSucceeded, f.Follow("sess", "j1", wait).Final.State)

	// The next input resumes the session, which counts again.
	sendCtl(t, f, "sess", "s1", input("come back"))
	sw.state(protocol.StateIdle, 2)
	f.SubmitJSON("sess", "j2", "/standin lines=2")
	log.waitFor(t, "j2 waiting behind the resumed session (tenant_cap)", func(ev protocol.StatusEvent) bool {
		return ev.ID == "j2" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonTenantCap
	})
	sendCtl(t, f, "sess", "s1", protocol.CtlOp{Op: protocol.OpEnd})
	require.Equal(t, protocol.StateSucceeded, f.Follow("sess", "s1", wait).Final.State)
	require.Equal(t, protocol.StateSucceeded, f.Follow("sess", "j2", wait).Final.State)

	peak, _, _ := log.peaks()
	require.Equal(t, 1, peak["sess"], "never more than max_running runs of the tenant at once")
	_, starts, _ := log.peaks()
	require.Equal(t, 1, starts["sess/j1"])
	require.Equal(t, 1, starts["sess/j2"])
}

// A job whose copy to the work subject the stream refuses stays in the
// queue, not on the work subject, and is admitted once the stream takes
// it; another tenant's job goes through meanwhile. (A pass purges what it
// admitted at its end, up to each subject's cursor: a refused copy must
// leave its cursor where it was.)
func TestAdmissionRefusedCopyStaysQueued(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	counts := func() map[string]uint64 {
		st, err := f.JS.Stream(ctx, f.Names.JobsStream())
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
		require.NoError(t, err)
		return info.State.Subjects
	}
	// Room for the big job as submitted, not for its copy, which adds the
	// admitter's headers (Fleet-Job-Seq, Fleet-Queued-At, a longer Msg-Id).
	big, err := json.Marshal(protocol.Job{ID: "big", Prompt: strings.Repeat("x", 400)})
	require.NoError(t, err)
	st, err := f.JS.Stream(ctx, f.Names.JobsStream())
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	limit := cfg.MaxMsgSize
	cfg.MaxMsgSize = int32(len(big) + 40)
	_, err = f.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)

	f.PublishJob("refused", big, map[string]string{protocol.HeaderMsgID: "big"})
	f.SubmitJSON("other", "small", "hi")
	fleettest.Eventually(t, wait, func() bool { return counts()[f.Names.WorkSubject("other")] == 1 },
		"the other tenant's job admitted")
	fleettest.Eventually(t, wait, func() bool { return counts()[f.Names.JobSubject("other")] == 0 },
		"and purged from the queue")
	c := counts()
	require.Equal(t, uint64(1), c[f.Names.JobSubject("refused")], "the refused job is still queued")
	require.Zero(t, c[f.Names.WorkSubject("refused")], "and not on the work subject")

	cfg.MaxMsgSize = limit
	_, err = f.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	fleettest.Eventually(t, wait, func() bool {
		c := counts()
		return c[f.Names.WorkSubject("refused")] == 1 && c[f.Names.JobSubject("refused")] == 0
	}, "the job admitted once the stream takes its copy")
}

// The fleet's cap is the work consumer's MaxAckPending, which the
// dispatcher started last set (another --max-concurrency, a rolling
// update): the leader admits up to it, so the jobs it cannot run wait
// with reason fleet_cap. Before, it admitted up to its own flag, and the
// jobs the consumer held back waited on the work subjects with no reason
// at all (found by QA).
func TestAdmissionFollowsTheWorkConsumersCap(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 3, Admission: admission.Config{LeaseTTL: time.Second}})
	log := watchStatuses(t, f.NC, f.Names)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// Another dispatcher starts with --max-concurrency 1.
	require.NoError(t, provision.Streams(ctx, f.JS, provision.Config{Names: f.Names, MaxConcurrency: 1, Storage: jetstream.FileStorage}))
	fleettest.Eventually(t, wait, func() bool {
		return f.Disp.Admitter().FleetCap() == 1
	}, "the leader reads the work consumer's cap")
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 3}).W)
	for _, id := range []string{"m1", "m2", "m3"} {
		f.SubmitJSON("mc", id, "/standin sleep=1h")
	}
	log.waitFor(t, "one job running", func(ev protocol.StatusEvent) bool {
		return ev.Tenant == "mc" && ev.State == protocol.StateRunning
	})
	log.waitFor(t, "a job waiting for the fleet's cap, saying so", func(ev protocol.StatusEvent) bool {
		return ev.Tenant == "mc" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonFleetCap && ev.Position == 2
	})
	peak, _, _ := log.peaks()
	require.Equal(t, 1, peak["mc"])
	for _, id := range []string{"m1", "m2", "m3"} {
		require.NoError(t, f.NC.Publish(f.Names.QueryCtl("mc", id), []byte(`{"op":"cancel"}`)))
	}
	for _, id := range []string{"m1", "m2", "m3"} {
		require.Equal(t, protocol.StateCancelled, f.Follow("mc", id, wait).Final.State)
	}
}

// A queued job cancelled out of its tenant's queue moves the jobs behind it
// up at once: their queued statuses give their new places. Before, the
// admitter's cached queue heads kept the cancelled job until its next
// admission, so the places stayed wrong (for a day, behind a day's budget)
// and a job that moved into the announced window got no reason at all
// (found by QA).
func TestAdmissionPlacesFollowACancel(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4})
	log := watchStatuses(t, f.NC, f.Names)
	setTenant(t, f, "pos", admission.Settings{MaxRunning: 1})
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	ids := []string{"p1", "p2", "p3", "p4"}
	for _, id := range ids {
		f.SubmitJSON("pos", id, "/standin sleep=1h")
	}
	log.waitFor(t, "p4 third in the queue", func(ev protocol.StatusEvent) bool {
		return ev.ID == "p4" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonTenantCap && ev.Position == 3
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rep, err := f.Client.Cancel(ctx, protocol.QueryRef{ID: "p2", Tenant: "pos"})
	require.NoError(t, err)
	require.Equal(t, protocol.StateCancelled, rep.Status.State, "p2 was cancelled while queued")
	log.waitFor(t, "p3 first in the queue", func(ev protocol.StatusEvent) bool {
		return ev.ID == "p3" && ev.State == protocol.StateQueued && ev.Position == 1
	})
	log.waitFor(t, "p4 second in the queue", func(ev protocol.StatusEvent) bool {
		return ev.ID == "p4" && ev.State == protocol.StateQueued && ev.Position == 2
	})
	for _, id := range ids {
		_, _ = f.Client.Cancel(ctx, protocol.QueryRef{ID: id, Tenant: "pos"})
	}
	for _, id := range ids {
		require.Equal(t, protocol.StateCancelled, f.Follow("pos", id, wait).Final.State)
	}
}

// An operator sees what holds a tenant back and can end a rate-limit
// pause: `tenant get` shows the budget window's spend and the pause with
// its end (also for a tenant without settings), and `tenant resume` ends
// the pause, so the waiting job starts. Before, get said only "no
// settings" and nothing cleared a pause but its reset time (found by QA).
func TestCLITenantShowsAndResumesAPause(t *testing.T) {
	t.Parallel()
	f := fleettest.New(t, fleettest.Opts{MaxConcurrency: 4})
	log := watchStatuses(t, f.NC, f.Names)
	fleettest.WaitReady(t, f.StartWorker(fleettest.WorkerOpts{Slots: 2}).W)
	url := f.Srv.ClientURL()
	reset := time.Now().Add(24 * time.Hour).Unix()
	f.SubmitJSON("eta", "r1", "/standin ratelimit="+strconv.FormatInt(reset, 10))
	require.Equal(t, protocol.StateSucceeded, f.Follow("eta", "r1", wait).Final.State)
	f.SubmitJSON("eta", "r2", "/standin")
	log.waitFor(t, "r2 held for the pause", func(ev protocol.StatusEvent) bool {
		return ev.ID == "r2" && ev.State == protocol.StateQueued && ev.Reason == protocol.ReasonRateLimited
	})

	code, out, errOut := runCLI(t, url, "", "tenant", "get", "eta")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "paused (rate limited) until ")
	require.Contains(t, errOut, "has no settings")

	setTenant(t, f, "spent", admission.Settings{BudgetUSD: 2, BudgetWindow: admission.Duration(time.Hour)})
	f.SubmitJSON("spent", "s1", "/standin cost=0.5")
	require.Equal(t, protocol.StateSucceeded, f.Follow("spent", "s1", wait).Final.State)
	waitSpend(t, f, "spent", time.Now(), time.Hour, 0.5)
	code, out, errOut = runCLI(t, url, "", "tenant", "get", "spent")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, out, "spent $0.5000 of $2 in the window since ")

	code, _, errOut = runCLI(t, url, "", "tenant", "resume", "eta")
	require.Equal(t, fleetcli.ExitOK, code, errOut)
	require.Contains(t, errOut, "tenant eta resumed")
	require.Equal(t, protocol.StateSucceeded, f.Follow("eta", "r2", wait).Final.State, "the pause is over: r2 runs")
	code, _, errOut = runCLI(t, url, "", "tenant", "get", "eta")
	require.Equal(t, fleetcli.ExitNotFound, code, errOut)
}
