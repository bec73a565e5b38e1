// Package fleetmetrics exports what an autoscaler and a dashboard need from
// the work queue, read from NATS at each scrape (so every dispatcher reports
// the same figures, and a restart loses nothing):
//
//   - fleet_queue_depth{tenant}: jobs no worker has taken yet. The tenant's
//     jobs in FLEET_JOBS (a work queue: a job stays until acked) minus those
//     the workers report running (discovery).
//   - fleet_queue_wait_seconds{tenant}: how long the tenant's oldest job not
//     yet taken has waited (0 when none waits).
//   - fleet_desired_workers: ceil((jobs waiting + jobs running) / slots per
//     worker), the worker count that would run everything at once. Jobs
//     waiting for admission count too, so it is an upper bound: the KEDA
//     ScaledObject in deploy/keda scales on the work consumer's lag, which
//     holds only admitted jobs (at most the fleet cap).
//
// A scrape that cannot read NATS reports fleet_metrics_up 0 and no figures
// rather than stale ones.
package fleetmetrics

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/internal/fleetapi"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Collector is the queue metrics' prometheus.Collector.
type Collector struct {
	client       *fleetapi.Client
	slots        int
	timeout      time.Duration
	now          func() time.Time
	depth, wait  *prometheus.Desc
	desired, up  *prometheus.Desc
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
		desired: prometheus.NewDesc("fleet_desired_workers", "Workers needed to run every waiting and running job at once (ceil(jobs / slots per worker)).", nil, nil),
		up:      prometheus.NewDesc("fleet_metrics_up", "1 when the last scrape could read the queue from NATS.", nil, nil),
	}, nil
}

// Client is the fleet client the collector reads through.
func (c *Collector) Client() *fleetapi.Client { return c.client }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.depth
	ch <- c.wait
	ch <- c.desired
	ch <- c.up
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
}

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
	total := 0
	counts, oldest := map[string]int{}, map[string]time.Time{}
	for subj, count := range info.State.Subjects {
		tenant, err := n.ParseJobSubject(subj)
		if err != nil {
			continue
		}
		counts[tenant] += int(count)
		total += int(count)
		// The oldest job not delivered: the first still waiting for
		// admission, or the first admitted after the last one delivered.
		from := uint64(1)
		if _, admitted := n.ParseWorkSubject(subj); admitted {
			from = delivered + 1
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
	s.DesiredWorkers = int(math.Ceil(float64(total) / float64(c.slots)))
	c.lastSnapshot = s
	return s, nil
}
