package relay

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's Prometheus metrics, shared by every relay of a
// worker (the worker registers them with its own).
type Metrics struct {
	LinesRelayed  prometheus.Counter
	BytesRelayed  prometheus.Counter
	PublishErrors prometheus.Counter
	// JournalFull is 1 while the journal's disk is full (the worker then
	// pulls no jobs); LinesNotJournaled counts lines relayed meanwhile.
	JournalFull       prometheus.Gauge
	LinesNotJournaled prometheus.Counter
	// LineGroups counts groups of lines stored with one acknowledgement,
	// by result: stored (counted whole) or resent (one by one).
	LineGroups *prometheus.CounterVec
}

// NewMetrics creates the relay's metrics, unregistered (Collectors lists
// them for a registry).
func NewMetrics() *Metrics {
	return &Metrics{
		LinesRelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_lines_relayed_total", Help: "Agent output lines journaled and relayed.",
		}),
		BytesRelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_bytes_relayed_total", Help: "Agent output bytes journaled and relayed.",
		}),
		PublishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_publish_errors_total", Help: "Failed NATS publishes (each retried).",
		}),
		JournalFull: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleet_worker_journal_full", Help: "1 while the journal's disk is full: the worker pulls no jobs until it has room.",
		}),
		LinesNotJournaled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_worker_lines_not_journaled_total", Help: "Lines relayed to NATS without a journal copy because its disk was full (the archiver stores them).",
		}),
		LineGroups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_worker_line_groups_total",
			Help: "Groups of queued lines published with one acknowledgement, by result: stored (the stream's count matched) or resent (sent again one by one).",
		}, []string{"result"}),
	}
}

// Collectors are the metrics, for a registry.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.LinesRelayed, m.BytesRelayed, m.PublishErrors, m.JournalFull, m.LinesNotJournaled, m.LineGroups}
}
