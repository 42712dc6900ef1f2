package server

import (
	"runtime/debug"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// TestSnapshotGauges: quarantines, trials and heals are read from the
// routing snapshot at scrape time, so they follow it without being set.
func TestSnapshotGauges(t *testing.T) {
	t.Parallel()
	peer := func(id, name string, role registry.Role, phase registry.HealPhase) registry.Peer {
		p := registry.Peer{ID: id, State: registry.StateReady}
		p.Name, p.Role, p.Model = name, role, "m"
		if phase != "" {
			p.State = registry.StateStale
			p.Heal.Phase = phase
		}
		return p
	}
	snaps := &swapSnapshots{}
	snaps.set(replica.NewSnapshot(1, nil, nil, time.Now()))
	reg := prometheus.NewRegistry()
	newServerMetrics(reg, snaps, "")

	check := func(q, trial, draining, verifying float64) {
		t.Helper()
		got := gauges(t, reg)
		want := map[string]float64{
			"pdplane_pairs_quarantined": q, "pdplane_pairs_on_trial": trial,
			"pdplane_peers_healing,phase=draining": draining, "pdplane_peers_healing,phase=verifying": verifying,
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s = %v (exported %v), want %v", k, g, ok, v)
			}
		}
	}
	check(0, 0, 0, 0)
	peers := []registry.Peer{
		peer("p1", "p1", registry.RolePrefill, ""), peer("p2", "p2", registry.RolePrefill, registry.HealDraining),
		peer("d1", "d1", registry.RoleDecode, ""), peer("d2", "d2", registry.RoleDecode, registry.HealVerifying),
		peer("d3", "d3", registry.RoleDecode, registry.HealVerifying),
	}
	qs := []registry.Quarantine{
		{PrefillID: "p1", DecodeID: "d1"}, {PrefillID: "p1", DecodeID: "d2"}, {PrefillID: "p2", DecodeID: "d1", Trial: true},
	}
	snaps.set(replica.NewSnapshot(2, peers, qs, time.Now()))
	check(2, 1, 1, 2)
	snaps.set(replica.NewSnapshot(3, peers[:1], nil, time.Now()))
	check(0, 0, 0, 0)
	// A peer whose lease ran out keeps its plan for when it comes back,
	// but is not being healed.
	failed := peer("d4", "d4", registry.RoleDecode, registry.HealVerifying)
	failed.State = registry.StateFailed
	snaps.set(replica.NewSnapshot(4, []registry.Peer{peers[3], failed}, nil, time.Now()))
	check(0, 0, 0, 1)
}

// gauges gathers reg's gauges as "name,label=value,..." -> value.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	return got
}

// TestPreflightGauges: pairs by preflight state (a failed one of an
// earlier generation is failed, not blocking) and the slowest and mean
// GB/s of the passed ones, per backend and memory kind.
func TestPreflightGauges(t *testing.T) {
	t.Parallel()
	peers := make([]registry.Peer, 0, 4)
	for _, id := range []string{"p1", "d1", "d2", "d3"} {
		p := registry.Peer{ID: id, State: registry.StateReady, Generation: 1}
		p.Name, p.Role, p.Model = id, registry.RoleDecode, "m"
		peers = append(peers, p)
	}
	peers[0].Role = registry.RolePrefill
	pf := func(d string, state registry.PreflightState, gbps float64, gen int64) registry.Preflight {
		return registry.Preflight{PrefillID: "p1", DecodeID: d, State: state, Backend: "nixl", MemKind: registry.DRAM, GBps: gbps,
			PrefillGeneration: 1, DecodeGeneration: gen}
	}
	snaps := &swapSnapshots{}
	snaps.set(replica.NewSnapshotWithPreflights(1, peers, nil, []registry.Preflight{
		pf("d1", registry.PreflightPassed, 1, 1), pf("d2", registry.PreflightPassed, 3, 1),
		pf("d3", registry.PreflightFailed, 0, 1), pf("d4", registry.PreflightFailed, 0, 1),
	}, time.Now()))
	reg := prometheus.NewRegistry()
	newServerMetrics(reg, snaps, "")
	got := gauges(t, reg)
	for k, v := range map[string]float64{
		"pdplane_preflight_pairs,state=passed": 2, "pdplane_preflight_pairs,state=failed": 2,
		"pdplane_preflight_pairs,state=blocking":                      1, // d4 is no peer of the snapshot
		"pdplane_preflight_gbps,backend=nixl,mem_kind=DRAM,stat=min":  1,
		"pdplane_preflight_gbps,backend=nixl,mem_kind=DRAM,stat=mean": 2,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (exported %v), want %v", k, g, ok, v)
		}
	}
}

type swapSnapshots struct{ s *replica.Snapshot }

func (w *swapSnapshots) set(s *replica.Snapshot)     { w.s = s }
func (w *swapSnapshots) Snapshot() *replica.Snapshot { return w.s }

func TestBuildVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		bi                *debug.BuildInfo
		version, revision string
	}{
		{"no build info", nil, "dev", "unknown"},
		{"go run", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev", "unknown"},
		{"stamped module version", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}}, "v0.3.1", "abc123"},
		{"dirty tree", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}, "dev", "abc123-dirty"},
		{"release build", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "-ldflags", Value: "-s -w -X main.version=1.4.0"}, {Key: "vcs.revision", Value: "def456"}}}, "1.4.0", "def456"},
		{"quoted ldflags", &debug.BuildInfo{Settings: []debug.BuildSetting{
			{Key: "-ldflags", Value: "\"-X 'main.version=2.0.0-rc1'\""}}}, "2.0.0-rc1", "unknown"},
	} {
		v, r := buildVersion(tc.bi, tc.bi != nil)
		if v != tc.version || r != tc.revision {
			t.Errorf("%s: version %q revision %q, want %q %q", tc.name, v, r, tc.version, tc.revision)
		}
	}
}

// TestBuildInfoVersion: a version the caller gives wins over the build
// information's.
func TestBuildInfoVersion(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	newServerMetrics(reg, &swapSnapshots{s: replica.NewSnapshot(1, nil, nil, time.Now())}, "1.2.3")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pdplane_build_info" {
			continue
		}
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != "1.2.3" || labels["revision"] == "" || labels["go_version"] == "" || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("pdplane_build_info %v = %v", labels, mf.GetMetric()[0].GetGauge().GetValue())
		}
		return
	}
	t.Fatal("no pdplane_build_info")
}
