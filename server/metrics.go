package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdplane/pdplane/registry"
)

// serverMetrics are the control plane's own metrics; the router registers
// its own on the same registry.
type serverMetrics struct {
	requests      *prometheus.CounterVec
	registrations *prometheus.CounterVec
	heartbeats    *prometheus.CounterVec
	staleMarks    *prometheus.CounterVec
	eventStreams  prometheus.Gauge
	rejected      *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer, snaps Snapshots) *serverMetrics {
	m := &serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_api_requests_total", Help: "Control-plane API requests by route and status code.",
		}, []string{"route", "code"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_registrations_total", Help: "Peer registrations by role and outcome.",
		}, []string{"role", "outcome"}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_heartbeats_total", Help: "Heartbeats answered, by action.",
		}, []string{"action"}),
		staleMarks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_stale_reports_total", Help: "Stale marks and failed-transfer reports received through the control-plane API, by source and outcome.",
		}, []string{"source", "outcome"}),
		eventStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pdplane_api_event_streams", Help: "Event streams (GET /api/v1/events/stream) open now.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_api_rejected_total", Help: "Control-plane requests refused before their handler ran, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.requests, m.registrations, m.heartbeats, m.staleMarks, m.eventStreams, m.rejected,
		&snapshotCollector{snaps: snaps})
	return m
}

// snapshotCollector reports the fleet as the router sees it, read from the
// current snapshot at scrape time.
type snapshotCollector struct{ snaps Snapshots }

var (
	peersDesc = prometheus.NewDesc("pdplane_peers", "Peers by role and state in the routing snapshot.",
		[]string{"role", "state"}, nil)
	snapshotVersionDesc = prometheus.NewDesc("pdplane_snapshot_version", "Version of the routing snapshot (rebuilds since start).", nil, nil)
	routableDesc        = prometheus.NewDesc("pdplane_routable", "1 when at least one compatible pair of ready peers exists.", nil, nil)
)

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- peersDesc
	ch <- snapshotVersionDesc
	ch <- routableDesc
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snaps.Snapshot()
	counts := map[[2]string]int{}
	for _, role := range []registry.Role{registry.RolePrefill, registry.RoleDecode, registry.RoleBoth} {
		for _, st := range registry.States() {
			counts[[2]string{string(role), string(st)}] = 0
		}
	}
	for _, p := range s.Peers() {
		counts[[2]string{string(p.Role), string(p.State)}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	ch <- prometheus.MustNewConstMetric(snapshotVersionDesc, prometheus.GaugeValue, float64(s.Version))
	ok, _ := s.Routable()
	v := 0.0
	if ok {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(routableDesc, prometheus.GaugeValue, v)
}
