// Package fleetmetrics exports what an autoscaler and a dashboard need from
// the work queue, read from NATS at each scrape (so every dispatcher reports
// the same figures, and a restart loses nothing):
//
//   - fleet_queue_depth{tenant}: jobs no worker has taken yet. The tenant's
//     jobs in FLEET_JOBS (a work queue: a job stays until acked) minus those
//     the workers report running (discovery).
//   - fleet_queue_wait_seconds{tenant}: how long the tenant's oldest job not
//     yet taken has waited (0 when none waits).
//   - fleet_desired_workers: ceil(jobs a worker could run now / slots per
//     worker): the admitted jobs (running, or waiting for a worker) and the
//     jobs admission would admit at once. A job held back by admission (a
//     budget, a rate-limit pause, its tenant's cap, the fleet's cap) is not
//     counted: a new worker could not start it, so an autoscaler reading
//     this gauge starts no worker for it.
//   - fleet_held_jobs{reason}: the jobs admission holds back, by the reason
//     it would give (budget, rate_limited, tenant_cap, fleet_cap).
//
// A scrape that cannot read NATS reports fleet_metrics_up 0 and no figures
// rather than stale ones.
package fleetmetrics

import (
	"context"
	"errors"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/internal/admission"
	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Collector is the queue metrics' prometheus.Collector.
type Collector struct {
	client       *fleetapi.Client
	slots        int
	timeout      time.Duration
	now          func() time.Time
	defaults     admission.Settings
	depth, wait  *prometheus.Desc
	desired, up  *prometheus.Desc
	held         *prometheus.Desc
	mu           sync.Mutex // one scrape at a time
	lastSnapshot Snapshot
}

// New returns a Collector reading through client; slotsPerWorker is the
// slots of one worker (>= 1), for fleet_desired_workers.
func New(client *fleetapi.Client, slotsPerWorker int) (*Collector, error) {
	if client == nil || slotsPerWorker < 1 {
		return nil, errors.New("fleetmetrics: a client and slotsPerWorker >= 1 are required")
	}
	return &Collector{
		client: client, slots: slotsPerWorker, timeout: 5 * time.Second, now: time.Now,
		depth:   prometheus.NewDesc("fleet_queue_depth", "Jobs no worker has taken yet, by tenant.", []string{"tenant"}, nil),
		wait:    prometheus.NewDesc("fleet_queue_wait_seconds", "How long the tenant's oldest job not yet taken has waited.", []string{"tenant"}, nil),
		desired: prometheus.NewDesc("fleet_desired_workers", desiredHelp, nil, nil),
		up:      prometheus.NewDesc("fleet_metrics_up", "1 when the last scrape could read the queue from NATS.", nil, nil),
		held:    prometheus.NewDesc("fleet_held_jobs", "Jobs admission holds back, by the reason it gives (budget, rate_limited, tenant_cap, fleet_cap).", []string{"reason"}, nil),
	}, nil
}

// WithTenantDefaults sets the settings of tenants without their own (the
// dispatcher's --tenant-max-running and --tenant-weight), which the
// reasons a job is held back depend on.
func (c *Collector) WithTenantDefaults(s admission.Settings) *Collector {
	c.defaults = s
	return c
}

// Client is the fleet client the collector reads through.
func (c *Collector) Client() *fleetapi.Client { return c.client }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.depth
	ch <- c.wait
	ch <- c.desired
	ch <- c.up
	ch <- c.held
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s, err := c.Snapshot(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for tenant, q := range s.Tenants {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(q.Waiting), tenant)
		ch <- prometheus.MustNewConstMetric(c.wait, prometheus.GaugeValue, q.OldestWait.Seconds(), tenant)
	}
	ch <- prometheus.MustNewConstMetric(c.desired, prometheus.GaugeValue, float64(s.DesiredWorkers))
	for _, reason := range heldReasons {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Held[reason]), reason)
	}
}

const desiredHelp = "Workers needed to run every job a worker could start now: the admitted ones and those admission would admit at once (ceil(jobs / slots per worker)); jobs admission holds back are in fleet_held_jobs."

// heldReasons are the reasons admission holds a job back, all reported
// (zero included) so a dashboard's series do not come and go.
var heldReasons = []string{protocol.ReasonBudget, protocol.ReasonRateLimited, protocol.ReasonTenantCap, protocol.ReasonFleetCap}

// TenantQueue is one tenant's part of the queue.
type TenantQueue struct {
	Waiting    int           `json:"waiting"`
	Running    int           `json:"running"`
	OldestWait time.Duration `json:"oldest_wait_ns"`
}

// Snapshot is the queue at one moment.
type Snapshot struct {
	At             time.Time              `json:"at"`
	Tenants        map[string]TenantQueue `json:"tenants"`
	Workers        []protocol.WorkerInfo  `json:"workers"`
	DesiredWorkers int                    `json:"desired_workers"`
	// Held counts the jobs admission holds back, by reason.
	Held map[string]int `json:"held"`
}

// Snapshot reads the queue: the jobs per tenant in FLEET_JOBS, the jobs the
// workers run, and the oldest waiting job of each tenant.
func (c *Collector) Snapshot(ctx context.Context) (Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.client.Names
	st, err := c.client.JS.Stream(ctx, n.JobsStream())
	if err != nil {
		return Snapshot{}, err
	}
	// Both the jobs waiting for admission (<prefix>.jobs.<tenant>) and the
	// admitted ones (<prefix>.work.<tenant>, internal/admission).
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return Snapshot{}, err
	}
	cons, err := c.client.JS.Consumer(ctx, n.JobsStream(), n.Consumer())
	if err != nil {
		return Snapshot{}, err
	}
	workers, err := c.client.Workers(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{At: c.now(), Tenants: map[string]TenantQueue{}, Workers: workers}
	running := map[string]int{}
	for _, w := range workers {
		for _, j := range w.Running {
			running[j.Tenant]++
		}
	}
	delivered := cons.CachedInfo().Delivered.Stream
	fleetCap := cons.CachedInfo().Config.MaxAckPending
	admitted := 0
	counts, oldest := map[string]int{}, map[string]time.Time{}
	unadmitted, admittedBy := map[string]int{}, map[string]int{}
	for subj, count := range info.State.Subjects {
		tenant, err := n.ParseJobSubject(subj)
		if err != nil {
			continue
		}
		counts[tenant] += int(count)
		// The oldest job not delivered: the first still waiting for
		// admission, or the first admitted after the last one delivered.
		from := uint64(1)
		if _, ok := n.ParseWorkSubject(subj); ok {
			from = delivered + 1
			admitted += int(count)
			admittedBy[tenant] += int(count)
		} else {
			unadmitted[tenant] += int(count)
		}
		if m, err := st.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj)); err == nil {
			if o, ok := oldest[tenant]; !ok || m.Time.Before(o) {
				oldest[tenant] = m.Time
			}
		}
	}
	for tenant, count := range counts {
		q := TenantQueue{Running: running[tenant], Waiting: max(0, count-running[tenant])}
		if o, ok := oldest[tenant]; ok && q.Waiting > 0 {
			q.OldestWait = max(0, s.At.Sub(o))
		}
		s.Tenants[tenant] = q
	}
	// The admitter counts a tenant's runs as its admitted jobs.
	admissible, held := c.hold(ctx, unadmitted, admittedBy, admitted, fleetCap)
	s.Held = held
	s.DesiredWorkers = int(math.Ceil(float64(admitted+admissible) / float64(c.slots)))
	c.lastSnapshot = s
	return s, nil
}

// hold sorts the jobs waiting for admission, per tenant, into those
// admission would admit now (admissible) and those it holds back, by the
// reason it would give: the admitter's own policy (admission.Policy.Decide)
// over the tenants' settings, spend and pauses as stored in NATS.
func (c *Collector) hold(ctx context.Context, waiting, running map[string]int, admitted, fleetCap int) (admissible int, held map[string]int) {
	held = map[string]int{}
	if len(waiting) == 0 {
		return 0, held
	}
	js, n := c.client.JS, c.client.Names
	tenants, _ := admission.OpenTenants(ctx, js, n, false)
	state, _ := admission.OpenState(ctx, js, n)
	pol := admission.Policy{Defaults: c.defaults, FleetCap: fleetCap}
	now := c.now()
	inFleet := admitted
	tenantNames := make([]string, 0, len(waiting))
	for t := range waiting {
		tenantNames = append(tenantNames, t)
	}
	sort.Strings(tenantNames)
	for _, t := range tenantNames {
		tn := admission.Tenant{Name: t, Running: running[t]}
		if tenants != nil {
			if st, err := tenants.Get(ctx, t); err == nil {
				tn.Settings = st
			}
		}
		if state != nil {
			eff := pol.Effective(tn.Settings)
			if eff.BudgetUSD > 0 {
				tn.Spent, _, _ = state.Spent(ctx, t, time.Duration(eff.BudgetWindow), now)
			}
			tn.PausedUntil, _ = state.PausedUntil(ctx, t, now)
		}
		for k := range waiting[t] {
			d := pol.Decide(tn, inFleet, now)
			if !d.Admit {
				held[d.Reason] += waiting[t] - k
				break
			}
			admissible++
			inFleet++
			tn.Running++
		}
	}
	return admissible, held
}
