package worker

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the worker's Prometheus metrics.
type Metrics struct {
	jobs          *prometheus.CounterVec
	runDuration   prometheus.Histogram
	running       prometheus.Gauge
	freeSlots     prometheus.Gauge
	linesRelayed  prometheus.Counter
	bytesRelayed  prometheus.Counter
	publishErrors prometheus.Counter
	redeliveries  prometheus.Counter
	// journalFull is 1 while the journal's disk is full (the worker then
	// pulls no jobs); linesNotJournaled counts lines relayed meanwhile.
	journalFull       prometheus.Gauge
	linesNotJournaled prometheus.Counter
	// lineGroups counts groups of lines stored with one acknowledgement,
	// by result: stored (counted whole) or resent (one by one).
	lineGroups *prometheus.CounterVec
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
		linesRelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_lines_relayed_total", Help: "Agent output lines journaled and relayed.",
		}),
		bytesRelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_bytes_relayed_total", Help: "Agent output bytes journaled and relayed.",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_publish_errors_total", Help: "Failed NATS publishes (each retried).",
		}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_redeliveries_total", Help: "Jobs received with more than one delivery.",
		}),
		journalFull: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleet_worker_journal_full", Help: "1 while the journal's disk is full: the worker pulls no jobs until it has room.",
		}),
		linesNotJournaled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_lines_not_journaled_total", Help: "Lines relayed to NATS without a journal copy because its disk was full (the archiver stores them).",
		}),
		lineGroups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_worker_line_groups_total",
			Help: "Groups of queued lines published with one acknowledgement, by result: stored (the stream's count matched) or resent (sent again one by one).",
		}, []string{"result"}),
	}
	m.freeSlots.Set(float64(slots))
	if reg != nil {
		reg.MustRegister(m.jobs, m.runDuration, m.running, m.freeSlots, m.linesRelayed, m.bytesRelayed, m.publishErrors, m.redeliveries, m.journalFull, m.linesNotJournaled, m.lineGroups)
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
