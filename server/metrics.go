package server

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// serverMetrics are the control plane's own metrics; the router registers
// its own on the same registry.
type serverMetrics struct {
	requests      *prometheus.CounterVec
	requestsBy    routeCounters // requests' series, resolved once each
	registrations *prometheus.CounterVec
	heartbeats    *prometheus.CounterVec
	staleMarks    *prometheus.CounterVec
	eventStreams  prometheus.Gauge
	rejected      *prometheus.CounterVec
	preflights    *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer, snaps Snapshots, version string) *serverMetrics {
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
		preflights: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pdplane_preflight_reports_total", Help: "Pair preflights reported by agents, by backend and state (passed, failed).",
		}, []string{"backend", "state"}),
	}
	m.requestsBy.vec = m.requests
	reg.MustRegister(m.requests, m.registrations, m.heartbeats, m.staleMarks, m.eventStreams, m.rejected, m.preflights,
		&snapshotCollector{snaps: snaps}, buildInfo(version))
	return m
}

// routeCounters are pdplane_api_requests_total's series by route pattern
// and status code, each resolved on its first request and kept: a
// request's count is then two loads, where WithLabelValues checks, hashes
// and looks up both values under the vector's lock. The routes are the
// mux's patterns and "unmatched", a small set.
type routeCounters struct {
	vec    *prometheus.CounterVec
	routes sync.Map // route pattern → *statusCounters
}

type statusCounters [len(statusLabels)]atomic.Pointer[prometheus.Counter]

// inc counts a request to route answered with status.
func (rc *routeCounters) inc(route string, status int) {
	if status < 100 || status >= len(statusLabels) {
		rc.vec.WithLabelValues(route, statusLabel(status)).Inc()
		return
	}
	v, ok := rc.routes.Load(route)
	if !ok {
		v, _ = rc.routes.LoadOrStore(route, new(statusCounters))
	}
	slot := &v.(*statusCounters)[status]
	c := slot.Load()
	if c == nil {
		s := rc.vec.WithLabelValues(route, statusLabels[status])
		c = &s
		slot.Store(c)
	}
	(*c).Inc()
}

// buildInfo is pdplane_build_info: 1, labelled with the build's version
// (the given one, else what the build information says), VCS revision and
// Go version.
func buildInfo(given string) prometheus.Collector {
	version, revision := runningVersion(given)
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pdplane_build_info",
		Help: "Always 1; its labels name the running build: version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{
			"version": version, "revision": revision, "go_version": runtime.Version(),
		},
	})
	g.Set(1)
	return g
}

// runningVersion is the given version, else what the build information
// says, and the VCS revision.
func runningVersion(given string) (version, revision string) {
	version, revision = buildVersion(debug.ReadBuildInfo())
	if given != "" {
		version = given
	}
	return version, revision
}

// ldflagsVersion finds a -X main.version=V in the build settings, which
// record -ldflags only for builds without -trimpath (the Dockerfile's has
// it: there the caller passes Config.Version).
var ldflagsVersion = regexp.MustCompile(`-X[= ]'?main\.version=([^'\s]+)`)

// buildVersion reads the version and revision of the running binary: the
// version linked in with -X main.version (what `pdplane version` prints),
// else the module version Go stamped, else "dev"; the revision is the VCS
// revision Go stamped ("unknown" without one), "-dirty" when modified.
func buildVersion(bi *debug.BuildInfo, ok bool) (version, revision string) {
	version, revision = "dev", "unknown"
	if !ok || bi == nil {
		return version, revision
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "-ldflags":
			if m := ldflagsVersion.FindStringSubmatch(s.Value); m != nil {
				version = m[1]
			}
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return version, revision
}

// snapshotCollector reports the fleet as the router sees it, read from the
// current snapshot at scrape time.
type snapshotCollector struct{ snaps Snapshots }

var (
	peersDesc = prometheus.NewDesc("pdplane_peers", "Peers by role and state in the routing snapshot.",
		[]string{"role", "state"}, nil)
	snapshotVersionDesc = prometheus.NewDesc("pdplane_snapshot_version", "Version of the routing snapshot (rebuilds since start).", nil, nil)
	routableDesc        = prometheus.NewDesc("pdplane_routable", "1 when at least one compatible pair of ready peers exists.", nil, nil)
	quarantinedDesc     = prometheus.NewDesc("pdplane_pairs_quarantined",
		"(prefill, decode) pairs quarantined in the routing snapshot: kept out of routing after a deterministic transfer failure.", nil, nil)
	onTrialDesc = prometheus.NewDesc("pdplane_pairs_on_trial",
		"(prefill, decode) pairs whose quarantine expired in the routing snapshot: routable again, their next transfer decides.", nil, nil)
	preflightPairsDesc = prometheus.NewDesc("pdplane_preflight_pairs",
		"(prefill, decode) pairs by the state of their last preflight in the routing snapshot: passed, failed, and blocking (failed on the current registrations, so kept out of routing).",
		[]string{"state"}, nil)
	preflightGBpsDesc = prometheus.NewDesc("pdplane_preflight_gbps",
		"GB/s of the passed preflights in the routing snapshot, per backend and memory kind: the slowest pair (min) and the mean.",
		[]string{"backend", "mem_kind", "stat"}, nil)
	healingDesc = prometheus.NewDesc("pdplane_peers_healing",
		"Peers with a heal plan running in the routing snapshot, by phase (quarantined, draining, verifying).", []string{"phase"}, nil)
)

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- peersDesc
	ch <- snapshotVersionDesc
	ch <- routableDesc
	ch <- quarantinedDesc
	ch <- onTrialDesc
	ch <- healingDesc
	ch <- preflightPairsDesc
	ch <- preflightGBpsDesc
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snaps.Snapshot()
	counts := map[[2]string]int{}
	for _, role := range []registry.Role{registry.RolePrefill, registry.RoleDecode, registry.RoleBoth} {
		for _, st := range registry.States() {
			counts[[2]string{string(role), string(st)}] = 0
		}
	}
	heals := map[registry.HealPhase]int{registry.HealQuarantined: 0, registry.HealDraining: 0, registry.HealVerifying: 0}
	for _, p := range s.Peers() {
		counts[[2]string{string(p.Role), string(p.State)}]++
		// A plan is running only while its peer holds a lease: a peer
		// that failed or left keeps its plan (its quarantines are lifted
		// when it comes back healed), but nothing is healing it.
		if p.Heal.Active() && registry.HoldsLease(p.State) {
			heals[p.Heal.Phase]++
		}
	}
	for phase, n := range heals {
		ch <- prometheus.MustNewConstMetric(healingDesc, prometheus.GaugeValue, float64(n), string(phase))
	}
	active, trial := s.QuarantineCounts()
	ch <- prometheus.MustNewConstMetric(quarantinedDesc, prometheus.GaugeValue, float64(active))
	ch <- prometheus.MustNewConstMetric(onTrialDesc, prometheus.GaugeValue, float64(trial))
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
	collectPreflights(ch, s)
}

// collectPreflights summarises the pairs' last preflights: per-pair series
// would be a million at 1,000 × 1,000 pairs, so the slowest and the mean
// GB/s per backend and memory kind stand for them (the pair list has each).
func collectPreflights(ch chan<- prometheus.Metric, s *replica.Snapshot) {
	states := map[string]int{"passed": 0, "failed": 0, "blocking": 0}
	type agg struct {
		min, sum float64
		n        int
	}
	rates := map[[2]string]*agg{}
	for _, pf := range s.Preflights() {
		states[string(pf.State)]++
		p, okP := s.Peer(pf.PrefillID)
		d, okD := s.Peer(pf.DecodeID)
		if pf.Failed() && okP && okD && pf.Current(p, d) {
			states["blocking"]++
		}
		if pf.Failed() {
			continue
		}
		k := [2]string{pf.Backend, pf.MemKind.String()}
		a := rates[k]
		if a == nil {
			a = &agg{min: pf.GBps}
			rates[k] = a
		}
		a.min, a.sum, a.n = min(a.min, pf.GBps), a.sum+pf.GBps, a.n+1
	}
	for st, n := range states {
		ch <- prometheus.MustNewConstMetric(preflightPairsDesc, prometheus.GaugeValue, float64(n), st)
	}
	for k, a := range rates {
		ch <- prometheus.MustNewConstMetric(preflightGBpsDesc, prometheus.GaugeValue, a.min, k[0], k[1], "min")
		ch <- prometheus.MustNewConstMetric(preflightGBpsDesc, prometheus.GaugeValue, a.sum/float64(a.n), k[0], k[1], "mean")
	}
}
