package replica_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

func peer(spec registry.PeerSpec, st registry.State) registry.Peer {
	return registry.Peer{PeerSpec: spec, ID: "id-" + spec.Name, State: st, Generation: 1}
}

func TestSnapshotRoutes(t *testing.T) {
	t.Parallel()
	dram := registrytest.Spec("d-dram-hetero", registry.RoleDecode)
	dram.Parallelism.TPSize, dram.Parallelism.AttnTPSize = 2, 2
	dram.Ranks[0].KVMemKinds = []registry.MemKind{registry.DRAM, registry.DRAM}
	peers := []registry.Peer{
		peer(registrytest.Spec("p0", registry.RolePrefill), registry.StateReady),
		peer(registrytest.Spec("p1", registry.RolePrefill), registry.StateStale),
		peer(registrytest.Spec("d0", registry.RoleDecode), registry.StateReady),
		peer(registrytest.Spec("d1", registry.RoleDecode), registry.StateReady),
		peer(registrytest.Spec("d2", registry.RoleDecode), registry.StatePending),
		peer(dram, registry.StateReady),
	}
	q := []registry.Quarantine{{PrefillID: "id-p0", DecodeID: "id-d1", Detail: "x"}}
	s := replica.NewSnapshot(1, peers, q, time.Now())
	r := s.Routes("m")
	if r == nil || len(r.Prefills) != 1 || r.Prefills[0].Name != "p0" {
		t.Fatalf("prefills = %+v", r)
	}
	ds := r.DecodesFor("id-p0")
	if len(ds) != 1 || ds[0].Name != "d0" {
		t.Fatalf("decodes for p0 = %v; want only d0 (d1 quarantined, d2 pending, DRAM hetero refused)", names(ds))
	}
	if ok, _ := s.Routable(); !ok {
		t.Fatal("snapshot with a routable pair says it is not routable")
	}
	pairs, total := s.Pairs(0)
	if total != 8 || len(pairs) != 8 {
		t.Fatalf("pairs = %d/%d, want 8 (2 prefills × 4 decodes)", len(pairs), total)
	}
	for _, p := range pairs {
		if p.Decode.Name == "d-dram-hetero" && (p.Verdict.Compatible || p.Routable) {
			t.Errorf("DRAM hetero-TP pair accepted: %+v", p.Verdict)
		}
		if p.Decode.Name == "d1" && p.Prefill.Name == "p0" && (p.Quarantined == nil || p.Routable) {
			t.Errorf("quarantined pair routable")
		}
	}
	empty := replica.NewSnapshot(2, []registry.Peer{peers[2]}, nil, time.Now())
	if ok, reason := empty.Routable(); ok || reason != "model m: no ready prefill" {
		t.Fatalf("decode-only snapshot: %v %q", ok, reason)
	}
}

// TestSnapshotUnhealthyDecode: an unhealthy decode is out of routing, and
// the readiness reason names it with its probe error.
func TestSnapshotUnhealthyDecode(t *testing.T) {
	t.Parallel()
	sick := peer(registrytest.Spec("d0", registry.RoleDecode), registry.StateUnhealthy)
	sick.StateReason = registry.UnhealthyReason("GET /health: connection refused")
	peers := []registry.Peer{peer(registrytest.Spec("p0", registry.RolePrefill), registry.StateReady), sick}
	s := replica.NewSnapshot(1, peers, nil, time.Now())
	if ds := s.Routes("m").DecodesFor("id-p0"); len(ds) != 0 {
		t.Fatalf("decodes for p0 = %v, want none: d0 is unhealthy", names(ds))
	}
	ok, reason := s.Routable()
	want := "model m: no ready decode (unhealthy: decode d0: engine unhealthy: GET /health: connection refused)"
	if ok || reason != want {
		t.Fatalf("Routable() = %v %q, want false %q", ok, reason, want)
	}
	var many []registry.Peer
	for i := range 5 {
		d := peer(registrytest.Spec(fmt.Sprintf("d%d", i), registry.RoleDecode), registry.StateUnhealthy)
		d.StateReason = "engine unhealthy"
		many = append(many, d)
	}
	_, reason = replica.NewSnapshot(2, many, nil, time.Now()).Routable()
	want = "no ready peers (unhealthy: decode d0: engine unhealthy; decode d1: engine unhealthy; decode d2: engine unhealthy; and 2 more)"
	if reason != want {
		t.Fatalf("Routable() reason %q, want %q", reason, want)
	}
}

func names(ps []*registry.Peer) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

// BenchmarkSnapshotBuild measures a snapshot rebuild at fleet sizes: what
// every replica pays, debounced, after a change.
func BenchmarkSnapshotBuild(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		peers := make([]registry.Peer, 0, n)
		for i := 0; i < n/2; i++ {
			peers = append(peers, peer(registrytest.Spec(fmt.Sprintf("p%d", i), registry.RolePrefill), registry.StateReady),
				peer(registrytest.Spec(fmt.Sprintf("d%d", i), registry.RoleDecode), registry.StateReady))
		}
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			for range b.N {
				replica.NewSnapshot(1, peers, nil, time.Now())
			}
		})
	}
}

// BenchmarkSnapshotPatch measures what every replica pays to follow one
// change at fleet sizes: one decode marked stale, then ready again, each
// snapshot built from the one before it (compare BenchmarkSnapshotBuild,
// the whole rebuild it replaces).
func BenchmarkSnapshotPatch(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		peers := make([]*registry.Peer, 0, n)
		for i := 0; i < n/2; i++ {
			p := peer(registrytest.Spec(fmt.Sprintf("p%05d", i), registry.RolePrefill), registry.StateReady)
			d := peer(registrytest.Spec(fmt.Sprintf("d%05d", i), registry.RoleDecode), registry.StateReady)
			peers = append(peers, &p, &d)
		}
		slices.SortFunc(peers, func(a, b *registry.Peer) int { return strings.Compare(a.Name, b.Name) })
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			s := replica.NextSnapshot(nil, 1, peers, nil, nil, nil)
			victim := slices.IndexFunc(peers, func(p *registry.Peer) bool { return p.Role == registry.RoleDecode })
			states := [2]registry.State{registry.StateStale, registry.StateReady}
			k := 0
			for b.Loop() {
				next := *peers[victim]
				next.State = states[k%2]
				k++
				order := slices.Clone(peers) // as the Mirror does: the previous snapshot keeps its list
				order[victim] = &next
				peers = order
				s = replica.NextSnapshot(s, uint64(k+1), peers, map[string]*registry.Peer{next.ID: &next}, nil, nil)
			}
			if len(s.Peers()) != n {
				b.Fatalf("snapshot holds %d peers, want %d", len(s.Peers()), n)
			}
		})
	}
}
