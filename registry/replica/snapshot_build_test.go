package replica_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// TestSnapshotPatchedEqualsRebuilt: a snapshot built from the previous one
// and the peers that changed answers every question exactly as one built
// whole from the same peers, quarantines and preflights, over thousands
// of random changes: peers come, go, change state, model, role, name,
// geometry and generation, and pairs are quarantined, put on trial and
// preflighted.
func TestSnapshotPatchedEqualsRebuilt(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			f := newRandomFleet(seed)
			var patched *replica.Snapshot
			for step := range 150 {
				changed := f.change()
				peers, qs, pfs := f.state()
				if step == 0 {
					changed = nil // the first snapshot is built whole
				}
				patched = replica.NextSnapshot(patched, uint64(step+1), peers, changed, qs, pfs)
				whole := replica.NextSnapshot(nil, uint64(step+1), peers, nil, qs, pfs)
				if got, want := describe(patched), describe(whole); got != want {
					t.Fatalf("step %d: patched snapshot differs from one built whole:\n%s", step, diff(got, want))
				}
				if got, want := describeRoutes(patched), referenceRoutes(peers, qs, pfs); got != want {
					t.Fatalf("step %d: routes differ from the pair-by-pair reference:\n%s", step, diff(got, want))
				}
			}
		})
	}
}

// randomFleet is a fleet that changes at random.
type randomFleet struct {
	rng         *rand.Rand
	peers       map[string]*registry.Peer
	quarantines map[[2]string]registry.Quarantine
	preflights  map[[2]string]registry.Preflight
	next        int
}

func newRandomFleet(seed uint64) *randomFleet {
	f := &randomFleet{rng: rand.New(rand.NewPCG(seed, 1)), peers: map[string]*registry.Peer{},
		quarantines: map[[2]string]registry.Quarantine{}, preflights: map[[2]string]registry.Preflight{}}
	for range 12 {
		f.add()
	}
	return f
}

func (f *randomFleet) pick(xs ...string) string { return xs[f.rng.IntN(len(xs))] }

// spec is a random peer spec: two models, three roles, three geometries
// (two of them incompatible with each other).
func (f *randomFleet) spec(name string) registry.PeerSpec {
	role := []registry.Role{registry.RolePrefill, registry.RoleDecode, registry.RoleDecode, registry.RolePrefill, registry.RoleBoth}[f.rng.IntN(5)]
	s := registrytest.Spec(name, role)
	s.Model = f.pick("m", "m", "m2")
	switch f.rng.IntN(4) {
	case 0:
		s.KV.PageSize = 32
	case 1:
		s.TransferGroup = "rack-2"
	}
	return s
}

func (f *randomFleet) add() *registry.Peer {
	f.next++
	id := fmt.Sprintf("id-%d", f.next)
	p := &registry.Peer{PeerSpec: f.spec(f.freeName()), ID: id, Generation: 1, State: f.state1()}
	f.peers[id] = p
	return p
}

// freeName is a name no peer has: the store keeps names unique.
func (f *randomFleet) freeName() string {
	for {
		name := fmt.Sprintf("peer-%02d", f.rng.IntN(60))
		taken := false
		for _, p := range f.peers {
			taken = taken || p.Name == name
		}
		if !taken {
			return name
		}
	}
}

func (f *randomFleet) state1() registry.State {
	return []registry.State{registry.StateReady, registry.StateReady, registry.StateReady, registry.StateStale,
		registry.StateUnhealthy, registry.StatePending, registry.StateDraining}[f.rng.IntN(7)]
}

func (f *randomFleet) anyPeer() *registry.Peer {
	ids := make([]string, 0, len(f.peers))
	for id := range f.peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return nil
	}
	return f.peers[ids[f.rng.IntN(len(ids))]]
}

// change changes one to three things and returns the peers that changed.
func (f *randomFleet) change() map[string]*registry.Peer {
	changed := map[string]*registry.Peer{}
	for range 1 + f.rng.IntN(3) {
		old := f.anyPeer()
		if old == nil {
			p := f.add()
			changed[p.ID] = p
			continue
		}
		p := *old // records are never modified: a change is a new one
		switch f.rng.IntN(9) {
		case 0:
			p := f.add()
			changed[p.ID] = p
			continue
		case 1:
			delete(f.peers, old.ID)
			changed[old.ID] = nil
			continue
		case 2:
			p.Name = f.freeName()
		case 3:
			p.PeerSpec = f.spec(p.Name)
		case 4:
			p.Generation++
		case 5, 6:
			p.State = f.state1()
		case 7:
			f.pairChange()
			continue
		case 8:
			p.Load = registry.Load{Running: f.rng.IntN(9)}
		}
		f.peers[p.ID] = &p
		changed[p.ID] = &p
	}
	return changed
}

// pairChange quarantines a pair, puts one on trial, lifts one, or records
// a preflight.
func (f *randomFleet) pairChange() {
	a, b := f.anyPeer(), f.anyPeer()
	if a == nil || b == nil {
		return
	}
	key := [2]string{a.ID, b.ID}
	switch f.rng.IntN(4) {
	case 0:
		f.quarantines[key] = registry.Quarantine{PrefillID: a.ID, DecodeID: b.ID, Detail: "x", Trial: f.rng.IntN(3) == 0}
	case 1:
		for k := range f.quarantines {
			delete(f.quarantines, k)
			break
		}
	default:
		st := registry.PreflightPassed
		if f.rng.IntN(2) == 0 {
			st = registry.PreflightFailed
		}
		f.preflights[key] = registry.Preflight{PrefillID: a.ID, DecodeID: b.ID, State: st,
			PrefillGeneration: a.Generation, DecodeGeneration: b.Generation - int64(f.rng.IntN(2))}
	}
}

// state is the fleet as a Mirror hands it to the builder: peers sorted by
// name.
func (f *randomFleet) state() ([]*registry.Peer, []registry.Quarantine, []registry.Preflight) {
	var peers []*registry.Peer
	for _, p := range f.peers {
		peers = append(peers, p)
	}
	slices.SortFunc(peers, func(a, b *registry.Peer) int { return strings.Compare(a.Name, b.Name) })
	var qs []registry.Quarantine
	for _, q := range f.quarantines {
		qs = append(qs, q)
	}
	var pfs []registry.Preflight
	for _, pf := range f.preflights {
		pfs = append(pfs, pf)
	}
	return peers, qs, pfs
}

// describe writes down every answer a snapshot gives the router, the API
// and the page.
func describe(s *replica.Snapshot) string {
	var b strings.Builder
	ids := peerIDs
	fmt.Fprintln(&b, "peers", ids(s.Peers()))
	for _, p := range s.Peers() {
		if got, ok := s.Peer(p.ID); !ok || got != p {
			fmt.Fprintln(&b, "lookup of", p.ID, "finds", got)
		}
	}
	ok, reason := s.Routable()
	fmt.Fprintln(&b, "routable", ok, reason)
	fmt.Fprintln(&b, "models", s.Models())
	for _, m := range s.Models() {
		r := s.Routes(m)
		fmt.Fprintln(&b, "model", m, "prefills", ids(r.Prefills), "decodes", ids(r.Decodes))
		for _, p := range s.Peers() {
			if ds := r.DecodesFor(p.ID); ds != nil {
				fmt.Fprintln(&b, "  decodes for", p.ID, ids(ds))
			}
		}
	}
	pairs, total := s.Pairs(0)
	fmt.Fprintln(&b, "pairs", total)
	for _, pv := range pairs {
		fmt.Fprintln(&b, " ", pv.Prefill.ID, pv.Decode.ID, pv.Verdict.Compatible, pv.Routable, pv.Quarantined != nil, pv.PreflightBlocks)
	}
	for _, g := range s.PairGroups() {
		fmt.Fprintf(&b, "group %+v\n", g)
	}
	fmt.Fprintf(&b, "counts %+v\n", s.Counts())
	a, tr := s.QuarantineCounts()
	fmt.Fprintln(&b, "quarantines", a, tr)
	return b.String()
}

// describeRoutes writes down the snapshot's routes.
func describeRoutes(s *replica.Snapshot) string {
	var b strings.Builder
	for _, m := range s.Models() {
		r := s.Routes(m)
		fmt.Fprintln(&b, "model", m, "prefills", peerIDs(r.Prefills), "decodes", peerIDs(r.Decodes))
		each := map[string][]*registry.Peer{}
		r.EachDecodeList(func(p *registry.Peer, ds []*registry.Peer) {
			if _, twice := each[p.ID]; twice {
				fmt.Fprintln(&b, "  EachDecodeList visits", p.ID, "twice")
			}
			each[p.ID] = ds
		})
		for _, p := range r.Prefills {
			ds, visited := each[p.ID]
			if !visited || !slices.Equal(ds, r.DecodesFor(p.ID)) {
				fmt.Fprintln(&b, "  EachDecodeList gives", p.ID, peerIDs(ds), "visited", visited)
			}
			fmt.Fprintln(&b, "  decodes for", p.ID, peerIDs(r.DecodesFor(p.ID)))
		}
		if len(each) != len(r.Prefills) {
			fmt.Fprintln(&b, "  EachDecodeList visits", len(each), "prefills of", len(r.Prefills))
		}
	}
	ok, _ := s.Routable()
	fmt.Fprintln(&b, "routable", ok)
	return b.String()
}

// referenceRoutes computes what describeRoutes must say pair by pair,
// the slow obvious way: for each ready prefill of a model, its ready
// decodes that CheckPair accepts, that are not itself, not quarantined
// with it and whose preflight with it did not fail, grouped by class in
// the order the name-sorted decodes first meet each class.
func referenceRoutes(peers []*registry.Peer, qs []registry.Quarantine, pfs []registry.Preflight) string {
	blocked := map[[2]string]bool{}
	for _, q := range qs {
		if q.Active() {
			blocked[[2]string{q.PrefillID, q.DecodeID}] = true
		}
	}
	gen := map[string]int64{}
	for _, p := range peers {
		gen[p.ID] = p.Generation
	}
	for _, pf := range pfs {
		if pf.Failed() && pf.PrefillGeneration == gen[pf.PrefillID] && pf.DecodeGeneration == gen[pf.DecodeID] {
			blocked[[2]string{pf.PrefillID, pf.DecodeID}] = true
		}
	}
	models := map[string]bool{}
	for _, p := range peers {
		if p.Routable() {
			models[p.Model] = true
		}
	}
	var b strings.Builder
	routable := false
	for _, m := range slices.Sorted(maps.Keys(models)) {
		var ps, ds []*registry.Peer
		for _, p := range peers {
			if p.Routable() && p.Model == m && p.Role.Prefills() {
				ps = append(ps, p)
			}
			if p.Routable() && p.Model == m && p.Role.Decodes() {
				ds = append(ds, p)
			}
		}
		fmt.Fprintln(&b, "model", m, "prefills", peerIDs(ps), "decodes", peerIDs(ds))
		var classes []string
		for _, d := range ds {
			if k := registry.CompatKey(&d.PeerSpec); !slices.Contains(classes, k) {
				classes = append(classes, k)
			}
		}
		for _, p := range ps {
			var out []*registry.Peer
			for _, k := range classes {
				for _, d := range ds {
					if registry.CompatKey(&d.PeerSpec) == k && d.ID != p.ID && !blocked[[2]string{p.ID, d.ID}] &&
						registry.CheckPair(&p.PeerSpec, &d.PeerSpec).Compatible {
						out = append(out, d)
					}
				}
			}
			routable = routable || len(out) > 0
			fmt.Fprintln(&b, "  decodes for", p.ID, peerIDs(out))
		}
	}
	fmt.Fprintln(&b, "routable", routable)
	return b.String()
}

func peerIDs(ps []*registry.Peer) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

func diff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n patched: %s\n whole:   %s", i+1, gl, wl)
		}
	}
	return "(same text)"
}

// TestMirrorFollowsChangesPeerByPeer: a Mirror that builds each snapshot
// from the previous one and the peers a change names ends up, after every
// step of a fleet's life, answering exactly as a snapshot built whole from
// the store.
func TestMirrorFollowsChangesPeerByPeer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memstore.New(memstore.Config{})
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	admin := registry.Claim{Admin: true}
	var ids []string
	for step := range 120 {
		var err error
		switch op := rng.IntN(6); {
		case op <= 1 || len(ids) == 0:
			role := []registry.Role{registry.RolePrefill, registry.RoleDecode, registry.RoleBoth}[rng.IntN(3)]
			spec := registrytest.Spec(fmt.Sprintf("peer-%03d", step), role)
			if rng.IntN(3) == 0 {
				spec.KV.PageSize = 32
			}
			var res registry.RegisterResult
			if res, err = store.Register(ctx, spec, admin); err == nil {
				ids = append(ids, res.Peer.ID)
				_, err = store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID})
			}
		case op == 2:
			_, err = store.MarkStale(ctx, ids[rng.IntN(len(ids))], "test", "")
		case op == 3:
			_, err = store.Drain(ctx, ids[rng.IntN(len(ids))])
		case op == 4:
			i := rng.IntN(len(ids))
			err = store.Delete(ctx, ids[i])
			ids = slices.Delete(ids, i, i+1)
		default:
			id := ids[rng.IntN(len(ids))]
			var p registry.Peer
			if p, err = store.Get(ctx, id); err == nil {
				_, err = store.Heartbeat(ctx, registry.Heartbeat{PeerID: id, InstanceID: p.InstanceID})
			}
		}
		if err != nil && !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("step %d: %v", step, err)
		}
		want := func() string {
			peers, err := store.List(ctx, registry.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			qs, _ := store.Quarantines(ctx)
			pfs, _ := store.Preflights(ctx)
			return describe(replica.NewSnapshotWithPreflights(0, peers, qs, pfs, time.Now()))
		}()
		deadline := time.Now().Add(5 * time.Second)
		for got := describe(m.Snapshot()); got != want; got = describe(m.Snapshot()) {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: the mirror's snapshot differs from the store's:\n%s", step, diff(got, want))
			}
			time.Sleep(time.Millisecond)
		}
	}
}
