package worker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/internal/relay"
)

// Metrics are the worker's Prometheus metrics.
type Metrics struct {
	jobs         *prometheus.CounterVec
	runDuration  prometheus.Histogram
	running      prometheus.Gauge
	freeSlots    prometheus.Gauge
	redeliveries prometheus.Counter
	stalls       *prometheus.CounterVec
	// relay are the relays' metrics (lines, bytes, publish errors,
	// groups) and the journal's disk being full.
	relay *relay.Metrics
}

// NewMetrics creates the metrics and registers them on reg (nil: not registered).
// backlog reports the journal's unpersisted lines and bytes.
func NewMetrics(reg prometheus.Registerer, slots int, backlog func() (lines, bytes int64)) *Metrics {
	m := &Metrics{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_worker_jobs_total",
			Help: "Jobs handled, by outcome (succeeded, failed, cancelled, invalid, retried, handed_back, fenced, replaced, duplicate).",
		}, []string{"outcome"}),
		runDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleet_worker_run_duration_seconds",
			Help:    "Wall-clock duration of agent runs.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleet_worker_running_slots", Help: "Jobs running on this worker.",
		}),
		freeSlots: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleet_worker_free_slots", Help: "Free job slots on this worker.",
		}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_redeliveries_total", Help: "Jobs received with more than one delivery.",
		}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_worker_stalls_total",
			Help: "Agent turns stalled (no output for the stall timeout while a turn ran), by tenant.",
		}, []string{"tenant"}),
		relay: relay.NewMetrics(),
	}
	m.freeSlots.Set(float64(slots))
	if reg != nil {
		reg.MustRegister(m.jobs, m.runDuration, m.running, m.freeSlots, m.redeliveries, m.stalls)
		reg.MustRegister(m.relay.Collectors()...)
		if backlog != nil {
			reg.MustRegister(
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "fleet_worker_journal_backlog_lines", Help: "Journaled lines not yet persisted to storage.",
				}, func() float64 { l, _ := backlog(); return float64(l) }),
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name: "fleet_worker_journal_backlog_bytes", Help: "Journaled bytes not yet persisted to storage.",
				}, func() float64 { _, b := backlog(); return float64(b) }),
			)
		}
	}
	return m
}

// Stalls is the counter of stalled turns, by tenant.
func (m *Metrics) Stalls() *prometheus.CounterVec { return m.stalls }
