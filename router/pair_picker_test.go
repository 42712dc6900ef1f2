package router

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/sim/simtest"
)

// fleet returns n ready peers of model m with IDs "id-" + name, half
// prefills and half decodes, all compatible (registrytest's geometry).
func fleet(n int) []registry.Peer {
	peers := make([]registry.Peer, n)
	for i := range peers {
		role := registry.RolePrefill
		if i%2 == 1 {
			role = registry.RoleDecode
		}
		spec := registrytest.Spec(fmt.Sprintf("peer-%05d", i), role)
		peers[i] = registry.Peer{PeerSpec: spec, ID: "id-" + spec.Name, State: registry.StateReady, Generation: 1}
	}
	return peers
}

// snapshots is a snapshot source whose peers a test sets: these tests are
// selection logic, with no engine or store behind the peers.
type snapshots struct {
	version atomic.Uint64
	cur     atomic.Pointer[replica.Snapshot]
}

func (s *snapshots) Snapshot() *replica.Snapshot { return s.cur.Load() }

// Set replaces every peer.
func (s *snapshots) Set(peers ...registry.Peer) {
	s.cur.Store(replica.NewSnapshot(s.version.Add(1), append([]registry.Peer(nil), peers...), nil, time.Now()))
}

func newPickRouter(tb testing.TB, cfg Config, peers []registry.Peer) (*Router, *snapshots) {
	tb.Helper()
	snaps := &snapshots{}
	snaps.Set(peers...)
	log := zerolog.Nop()
	if t, ok := tb.(*testing.T); ok {
		log = zerolog.New(zerolog.NewTestWriter(t))
	}
	rt, err := New(cfg, snaps, nil, log, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(rt.Close)
	return rt, snaps
}

func pickN(t *testing.T, rt *Router, n int, key func(i int) uint64) (prefills, decodes map[string]int) {
	t.Helper()
	prefills, decodes = map[string]int{}, map[string]int{}
	for i := range n {
		v := rt.currentView()
		pr, ok := rt.pickPair(v, v.models["m"], key(i), nil, &exclusions{})
		if !ok {
			t.Fatalf("pick %d: no pair", i)
		}
		if !pr.p.peer.Role.Prefills() || !pr.d.peer.Role.Decodes() {
			t.Fatalf("picked %s/%s", pr.p.peer.Name, pr.d.peer.Name)
		}
		prefills[pr.p.peer.Name]++
		decodes[pr.d.peer.Name]++
		rt.settle(&pr, nil)
	}
	return prefills, decodes
}

func TestPolicySpread(t *testing.T) {
	t.Parallel()
	for _, pol := range []Policy{PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyCacheAware, PolicyLeastLoad} {
		t.Run(string(pol), func(t *testing.T) {
			t.Parallel()
			rt, _ := newPickRouter(t, Config{PrefillPolicy: pol, DecodePolicy: pol}, fleet(20))
			p, d := pickN(t, rt, 2000, func(i int) uint64 { return xxhash.Sum64String(strconv.Itoa(i)) })
			if len(p) != 10 || len(d) != 10 {
				t.Fatalf("used %d prefills and %d decodes of 10 each", len(p), len(d))
			}
			if pol == PolicyRoundRobin {
				for name, c := range p {
					if c != 200 {
						t.Fatalf("round robin gave %s %d of 2000", name, c)
					}
				}
			}
		})
	}
}

func TestPowerOfTwoPrefersIdle(t *testing.T) {
	t.Parallel()
	rt, _ := newPickRouter(t, Config{PrefillPolicy: PolicyPowerOfTwo, DecodePolicy: PolicyPowerOfTwo}, fleet(4))
	v := rt.currentView()
	busy := v.byID["id-peer-00000"]
	busy.inflight.Store(100)
	p, _ := pickN(t, rt, 200, func(int) uint64 { return 0 })
	if p["peer-00000"] != 0 || p["peer-00002"] != 200 {
		t.Fatalf("picks %v: the busy prefill was chosen", p)
	}
}

// withLoad is p as a heartbeat at at reporting l left it.
func withLoad(p registry.Peer, l registry.Load, at time.Time) registry.Peer {
	p.Load, p.LastHeartbeat = l, &at
	return p
}

// TestLoadPoliciesUseHeartbeatLoad: least_load and power_of_two send new
// work away from the decode whose engine reports itself busy, though no
// request of this router is in flight to either; with equal requests the
// lower KV usage wins.
func TestLoadPoliciesUseHeartbeatLoad(t *testing.T) {
	t.Parallel()
	at := time.Now()
	for _, pol := range []Policy{PolicyLeastLoad, PolicyPowerOfTwo} {
		t.Run(string(pol), func(t *testing.T) {
			t.Parallel()
			peers := fleet(4) // prefills 0, 2; decodes 1, 3
			peers[1] = withLoad(peers[1], registry.Load{Running: 3, Queued: 2}, at)
			peers[3] = withLoad(peers[3], registry.Load{Running: 1}, at)
			rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: pol}, peers)
			if _, d := pickN(t, rt, 200, func(int) uint64 { return 0 }); d["peer-00003"] != 200 {
				t.Fatalf("decode picks %v: want all on peer-00003 (1 request against 5)", d)
			}
			peers[1] = withLoad(peers[1], registry.Load{Running: 1, KVUsage: 0.2}, at.Add(time.Second))
			peers[3] = withLoad(peers[3], registry.Load{Running: 1, KVUsage: 0.9}, at.Add(time.Second))
			snaps.Set(peers...)
			if _, d := pickN(t, rt, 200, func(int) uint64 { return 0 }); d["peer-00001"] != 200 {
				t.Fatalf("decode picks %v: want all on peer-00001 (equal requests, less KV in use)", d)
			}
		})
	}
}

// TestLoadBlendsInflight: between heartbeats, the router adds its own
// requests sent since the heartbeat to what the engine reported; a newer
// heartbeat, which already counts them, resets the baseline.
func TestLoadBlendsInflight(t *testing.T) {
	t.Parallel()
	at := time.Now()
	peers := fleet(4)
	peers[1] = withLoad(peers[1], registry.Load{Running: 3}, at)
	peers[3] = withLoad(peers[3], registry.Load{Running: 4}, at)
	rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyLeastLoad}, peers)
	v := rt.currentView()
	a := v.refs[v.snap.Peers()[1]]
	if ra := loadOf(t, rt, 1); ra != 3 {
		t.Fatalf("load of peer-00001 with nothing in flight: %d, want its reported 3", ra)
	}
	a.state.inflight.Add(2) // two requests sent since the heartbeat
	if ra := loadOf(t, rt, 1); ra != 5 {
		t.Fatalf("load of peer-00001 with 2 sent since the heartbeat: %d, want 5", ra)
	}
	if rb := loadOf(t, rt, 3); rb >= 5 {
		t.Fatalf("load of peer-00003 (4 reported) is %d: not less than peer-00001's (3 reported + 2 sent)", rb)
	}
	// The next heartbeat counts the two.
	peers[1] = withLoad(peers[1], registry.Load{Running: 5}, at.Add(time.Second))
	snaps.Set(peers...)
	if ra := loadOf(t, rt, 1); ra != 5 {
		t.Fatalf("load after a heartbeat that counts the router's requests: %d, want 5", ra)
	}
	a.state.inflight.Add(-2) // both finished
	if ra := loadOf(t, rt, 1); ra != 3 {
		t.Fatalf("load after the router's 2 requests finished: %d, want 3", ra)
	}
	// Never fewer than the router's own requests in flight.
	peers[3] = withLoad(peers[3], registry.Load{}, at.Add(2*time.Second))
	snaps.Set(peers...)
	v = rt.currentView()
	v.refs[v.snap.Peers()[3]].state.inflight.Add(7)
	if got := loadOf(t, rt, 3); got < 7 {
		t.Fatalf("load %d below the 7 requests in flight", got)
	}
}

// loadOf is the requests a pick through the router's current view counts
// for the peer at index i of its snapshot, read through the first list that
// holds it.
func loadOf(t *testing.T, rt *Router, i int) int64 {
	t.Helper()
	v := rt.currentView()
	pc := pickCtx{clock: time.Now}
	pc.loads, pc.pending = v.loadsFor(v.snap.Loads())
	for id, l := range v.lists {
		for k, c := range l {
			if c.ref == &v.peers[i] {
				reqs, _ := pc.load(pc.list(l, int32(id)), k)
				return reqs
			}
		}
	}
	t.Fatalf("peer %d is in no candidate list", i)
	return 0
}

func TestCacheAwareAffinityAndFallback(t *testing.T) {
	t.Parallel()
	rt, _ := newPickRouter(t, Config{PrefillPolicy: PolicyCacheAware, DecodePolicy: PolicyCacheAware, CacheAwareBalanceAbs: 4, CacheAwareBalanceRel: 2}, fleet(40))
	key := xxhash.Sum64String("You are a helpful assistant.")
	p, d := pickN(t, rt, 50, func(int) uint64 { return key })
	if len(p) != 1 || len(d) != 1 {
		t.Fatalf("one prefix went to %d prefills and %d decodes", len(p), len(d))
	}
	var fav string
	for name := range p {
		fav = name
	}
	// Make the favoured prefill busy: requests move elsewhere.
	rt.currentView().byID["id-"+fav].inflight.Store(50)
	p, _ = pickN(t, rt, 50, func(int) uint64 { return key })
	if p[fav] != 0 {
		t.Fatalf("busy favoured prefill still got %d of 50", p[fav])
	}
}

func TestRingMovesOnlyTheRemovedPeersKeys(t *testing.T) {
	t.Parallel()
	peers := fleet(200)
	rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyCacheAware}, peers)
	owner := func() map[int]string {
		v := rt.currentView()
		mv := v.models["m"]
		out := map[int]string{}
		for i := range 2000 {
			h := xxhash.Sum64String(strconv.Itoa(i))
			out[i] = mv.prefills[mv.ring.owners[mv.ring.locate(h)]].ref.peer.Name
		}
		return out
	}
	before := owner()
	removed := peers[10].Name
	snaps.Set(append(append([]registry.Peer(nil), peers[:10]...), peers[11:]...)...)
	after := owner()
	moved := 0
	for k, o := range before {
		if after[k] != o {
			if o != removed {
				t.Fatalf("key %d moved from %s, which is still there", k, o)
			}
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key moved although its owner left")
	}
}

func TestEligibility(t *testing.T) {
	t.Parallel()
	rt, _ := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyRoundRobin, BreakerFailures: 1, BreakerCooldown: time.Hour}, fleet(6))
	v := rt.currentView()
	mv := v.models["m"]
	// Exclude one prefill, open another's breaker, exclude the pair of the
	// prefill left and one decode (a pair that failed as a pair).
	ex := &exclusions{}
	ex.add("id-peer-00000")
	v.byID["id-peer-00002"].breaker.failure(false, 1, time.Now())
	ex.addPair("id-peer-00004", "id-peer-00001")
	for range 30 {
		pr, ok := rt.pickPair(v, mv, 0, nil, ex)
		if !ok {
			t.Fatal("no pair")
		}
		if pr.p.peer.Name != "peer-00004" || pr.d.peer.Name == "peer-00001" {
			t.Fatalf("picked %s/%s", pr.p.peer.Name, pr.d.peer.Name)
		}
		pr.release()
	}
	// Nothing eligible: no pair.
	ex.add("id-peer-00004")
	if _, ok := rt.pickPair(v, mv, 0, nil, ex); ok {
		t.Fatal("picked a pair with every prefill ineligible")
	}
}

func TestBreakerLifecycle(t *testing.T) {
	t.Parallel()
	var b breaker
	var trans []breakerState
	b.onChange = func(_, to breakerState) { trans = append(trans, to) }
	now := time.Unix(0, 0)
	const cool = time.Second
	for i := range 2 {
		if ok, probe := b.acquire(now, cool); !ok || probe {
			t.Fatalf("closed breaker refused request %d", i)
		}
		b.failure(false, 3, now)
	}
	b.success(false) // resets the count
	for range 3 {
		b.failure(false, 3, now)
	}
	if b.current() != breakerOpen {
		t.Fatalf("state %v after 3 consecutive failures", b.current())
	}
	if ok, _ := b.acquire(now.Add(cool/2), cool); ok {
		t.Fatal("open breaker let a request through before the cool-down")
	}
	ok, probe := b.acquire(now.Add(cool), cool)
	if !ok || !probe || b.current() != breakerHalfOpen {
		t.Fatalf("after cool-down: ok=%t probe=%t state=%v", ok, probe, b.current())
	}
	if ok, _ := b.acquire(now.Add(cool), cool); ok {
		t.Fatal("half-open breaker let a second request through")
	}
	b.release(true) // the probe ended without a verdict
	ok, probe = b.acquire(now.Add(cool), cool)
	if !ok || !probe {
		t.Fatal("released probe not available again")
	}
	b.failure(true, 3, now.Add(cool)) // probe failed: open again
	if b.current() != breakerOpen {
		t.Fatalf("state %v after failed probe", b.current())
	}
	_, probe = b.acquire(now.Add(3*cool), cool)
	b.success(probe)
	if b.current() != breakerClosed {
		t.Fatalf("state %v after successful probe", b.current())
	}
	want := []breakerState{breakerOpen, breakerHalfOpen, breakerOpen, breakerHalfOpen, breakerClosed}
	if fmt.Sprint(trans) != fmt.Sprint(want) {
		t.Fatalf("transitions %v, want %v", trans, want)
	}
}

// BenchmarkPickPair: pickPair through a fleet of n peers none of which has
// heartbeated, so the load-aware policies compare in-flight counts.
func BenchmarkPickPair(b *testing.B) {
	for _, pol := range []Policy{PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyCacheAware, PolicyLeastLoad} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/peers=%d", pol, n), func(b *testing.B) {
				benchPickPair(b, pol, fleet(n))
			})
		}
	}
}

// BenchmarkPickPairLoaded: the load-aware policies through a fleet whose
// every peer has heartbeated a load (its running, queued and KV usage
// differ from its neighbours'), so a pick compares reported loads as in
// production. A view reads a load table's loads, once resolved, as it reads
// these.
func BenchmarkPickPairLoaded(b *testing.B) {
	at := time.Now()
	for _, pol := range []Policy{PolicyPowerOfTwo, PolicyCacheAware, PolicyLeastLoad} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/peers=%d", pol, n), func(b *testing.B) {
				peers := fleet(n)
				for i := range peers {
					peers[i] = withLoad(peers[i], registry.Load{Running: i % 7, Queued: i % 3, KVUsage: float64(i%10) / 10}, at)
				}
				benchPickPair(b, pol, peers)
			})
		}
	}
}

// benchPickPair times pickPair with pol for both roles, over 1,024 keys.
func benchPickPair(b *testing.B, pol Policy, peers []registry.Peer) {
	rt, _ := newPickRouter(b, Config{PrefillPolicy: pol, DecodePolicy: pol}, peers)
	v := rt.currentView()
	mv := v.models["m"]
	keys := make([]uint64, 1024)
	for i := range keys {
		keys[i] = xxhash.Sum64String(strconv.Itoa(i))
	}
	var ex exclusions
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		pr, ok := rt.pickPair(v, mv, keys[i&1023], nil, &ex)
		if !ok {
			b.Fatal("no pair")
		}
		pr.release()
		i++
	}
}

// TestViewDecodeListsMatchSnapshot: the decode list a view resolves for each
// prefill holds exactly the snapshot's compatible, unquarantined decodes, in
// its order; prefills of one class share one list; and after a rebuild the
// lists follow the new snapshot while each peer keeps its state, so a
// breaker opened or a request counted through the old view is seen by picks
// through the new one.
func TestViewDecodeListsMatchSnapshot(t *testing.T) {
	t.Parallel()
	peers := fleet(12) // prefills 0, 2, ..; decodes 1, 3, ..
	for _, i := range []int{8, 9, 10, 11} {
		peers[i].KV.PageSize = 32 // a second class, incompatible with the first
	}
	peers[6].Role = registry.RoleBoth
	rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyRoundRobin, BreakerFailures: 1, BreakerCooldown: time.Hour}, peers)
	quarantine := []registry.Quarantine{{PrefillID: "id-peer-00002", DecodeID: "id-peer-00003", At: time.Now()}}
	snaps.cur.Store(replica.NewSnapshot(snaps.version.Add(1), append([]registry.Peer(nil), peers...), quarantine, time.Now()))
	v := checkDecodeLists(t, rt)
	if got := names(v.refs[v.snap.Peers()[2]].decodes); got != "peer-00001 peer-00005 peer-00006 peer-00007" {
		t.Fatalf("quarantined prefill peer-00002 pairs with %s", got)
	}
	if a, b := v.refs[v.snap.Peers()[0]].decodes, v.refs[v.snap.Peers()[4]].decodes; &a[0] != &b[0] {
		t.Fatal("prefills of one class resolved two lists")
	}

	// Through the old view: open peer-00001's breaker, count a request to
	// peer-00005. Then drop peer-00007 and the quarantine.
	v.byID["id-peer-00001"].breaker.failure(false, 1, time.Now())
	v.byID["id-peer-00005"].inflight.Add(3)
	snaps.Set(append(append([]registry.Peer(nil), peers[:7]...), peers[8:]...)...)
	nv := checkDecodeLists(t, rt)
	if nv == v {
		t.Fatal("the view was not rebuilt")
	}
	if got := names(nv.refs[nv.snap.Peers()[2]].decodes); got != "peer-00001 peer-00003 peer-00005 peer-00006" {
		t.Fatalf("peer-00002 pairs with %s after the rebuild", got)
	}
	if n := nv.byID["id-peer-00005"].inflight.Load(); n != 3 {
		t.Fatalf("requests in flight to peer-00005 after the rebuild: %d, want 3", n)
	}
	_, d := pickN(t, rt, 40, func(int) uint64 { return 0 })
	if d["peer-00001"] != 0 || d["peer-00007"] != 0 {
		t.Fatalf("decode picks %v: the open breaker's or the removed peer's decode was chosen", d)
	}
}

// checkDecodeLists asserts that the current view's decode list of every
// prefill is the snapshot's, resolved to the view's own refs, and returns
// the view.
func checkDecodeLists(t *testing.T, rt *Router) *view {
	t.Helper()
	v := rt.currentView()
	for _, name := range v.snap.Models() {
		for _, p := range v.snap.Routes(name).Prefills {
			want := v.snap.Routes(name).DecodesFor(p.ID)
			got := v.refs[p].decodes
			if len(got) != len(want) {
				t.Fatalf("prefill %s: %d decodes, snapshot has %d", p.Name, len(got), len(want))
			}
			for i, d := range want {
				if got[i].ref != v.refs[d] || got[i].ref != &v.peers[slices.Index(v.snap.Peers(), d)] || got[i].state != got[i].ref.state {
					t.Fatalf("prefill %s: decode %d is not the view's ref of %s", p.Name, i, d.Name)
				}
			}
		}
	}
	return v
}

// names lists the candidates' peer names, space-separated.
func names(c []cand) string {
	out := make([]string, len(c))
	for i, r := range c {
		out[i] = r.ref.peer.Name
	}
	return strings.Join(out, " ")
}

// TestRingLocateMatchesBinarySearch: the ring's bucket index finds the same
// point as a binary search over the whole ring, for rings of one point to
// thousands, at every point, next to it, at the ends, and at random hashes.
func TestRingLocateMatchesBinarySearch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ prefills, vnodes int }{{1, 1}, {1, 3}, {3, 1}, {5, 32}, {200, 32}} {
		peers := fleet(2 * tc.prefills)
		prefills := make([]*registry.Peer, tc.prefills)
		for i := range prefills {
			prefills[i] = &peers[2*i]
		}
		r := buildRing(prefills, tc.vnodes, nil)
		hashes := []uint64{0, 1, math.MaxUint64}
		for _, p := range r.points {
			hashes = append(hashes, p-1, p, p+1)
		}
		for i := range 5000 {
			hashes = append(hashes, xxhash.Sum64String(strconv.Itoa(i)))
		}
		for _, h := range hashes {
			want, _ := slices.BinarySearch(r.points, h)
			if want == len(r.points) {
				want = 0
			}
			if got := r.locate(h); got != want {
				t.Fatalf("%d prefills × %d: locate(%#x) = %d, want %d", tc.prefills, tc.vnodes, h, got, want)
			}
		}
	}
}

// TestPickLayout: a view's ref is one cache line, a candidate list's entry
// a quarter of one (a window of 8 candidates: two lines), and what
// eligibility and load read of a peer's state (the load baseline and the
// breaker's state word) lies in the state's first line.
func TestPickLayout(t *testing.T) {
	t.Parallel()
	if got := unsafe.Sizeof(peerRef{}); got != peerRefSize {
		t.Fatalf("peerRef is %d bytes, want %d", got, peerRefSize)
	}
	if got := unsafe.Sizeof(cand{}); got != 16 {
		t.Fatalf("a candidate list's entry is %d bytes, want 16", got)
	}
	var st peerState
	if end := unsafe.Offsetof(st.breaker) + unsafe.Offsetof(st.breaker.state) + unsafe.Sizeof(st.breaker.state); end > 64 {
		t.Fatalf("the breaker's state word of a peer's state ends at byte %d, past the first cache line", end)
	}
	if size := unsafe.Sizeof(st); size%64 != 0 {
		t.Fatalf("peerState is %d bytes: not a size the allocator aligns to a cache line", size)
	}
}

// TestLoadRefreshReachesPicks: a load-aware policy follows the loads a
// Mirror's refresh brings, which rebuild no snapshot: the view resolves its
// peers' slots in each new load set.
func TestLoadRefreshReachesPicks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memstore.New(memstore.Config{})
	log := zerolog.New(zerolog.NewTestWriter(t))
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: 2 * time.Millisecond}, store, log)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	beat := map[string]registry.Heartbeat{}
	for _, spec := range []registry.PeerSpec{
		registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode), registrytest.Spec("d1", registry.RoleDecode),
	} {
		res, err := store.Register(ctx, spec, registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		beat[spec.Name] = registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}
		if _, err := store.Heartbeat(ctx, beat[spec.Name]); err != nil {
			t.Fatal(err)
		}
	}
	simtest.WaitFor(t, "both decodes routable", func() bool {
		r := m.Snapshot().Routes("m")
		return r != nil && len(r.Decodes) == 2
	})
	rt, err := New(Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyLeastLoad}, m, nil, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	v := rt.currentView()
	for _, busy := range []string{"d0", "d1", "d0"} {
		for name, hb := range beat {
			hb.Load = registry.Load{}
			if name == busy {
				hb.Load.Running = 5
			}
			if _, err := store.Heartbeat(ctx, hb); err != nil {
				t.Fatal(err)
			}
		}
		simtest.WaitFor(t, "picks to leave the busy "+busy, func() bool {
			_, d := pickN(t, rt, 20, func(int) uint64 { return 0 })
			return d[busy] == 0
		})
		if rt.currentView() != v {
			t.Fatal("a load-only heartbeat rebuilt the view; the slots were not what moved the picks")
		}
		// The first pick that saw the set started resolving its slots in
		// the background; on a busy machine that may finish after the
		// picks moved (through the set's pending lookups).
		simtest.WaitFor(t, "the view to resolve its slots in a load set", func() bool { return v.loads.Load() != nil })
	}
}

// TestPendingLoadsMatchResolved: until a view has resolved a new load set,
// its picks look each candidate's load up in the set by ID; once resolved,
// they read it from the lists' loads. Both read the same loads: the set's
// where its heartbeat is newer than the record's, the record's where it is
// older or the set has none.
func TestPendingLoadsMatchResolved(t *testing.T) {
	t.Parallel()
	at := time.Now()
	peers := fleet(8) // decodes 1, 3, 5, 7
	for i := range peers {
		peers[i] = withLoad(peers[i], registry.Load{Running: 10 + i}, at)
	}
	rt, _ := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyLeastLoad}, peers)
	var table replica.LoadTable
	table.Set([]registry.PeerLoad{
		{PeerID: "id-peer-00001", Load: registry.Load{Running: 1}, At: at.Add(time.Second)},  // newer: wins
		{PeerID: "id-peer-00003", Load: registry.Load{Running: 2}, At: at.Add(-time.Second)}, // older: the record's
	})
	set := table.Current()
	want := map[int]int64{1: 1, 3: 13, 5: 15, 7: 17}
	v := rt.currentView()
	loads := func() map[int]int64 {
		vl, pending := v.loadsFor(set)
		pc := pickCtx{clock: time.Now, loads: vl, pending: pending}
		got := map[int]int64{}
		for k, c := range v.lists[v.peers[0].decodesID] {
			got[int(c.ref.index)], _ = pc.load(pc.list(v.peers[0].decodes, v.peers[0].decodesID), k)
		}
		return got
	}
	if _, pending := v.loadsFor(set); pending != set {
		t.Fatal("a load set the view has not resolved is not pending")
	}
	if got := loads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loads looked up by ID: %v, want %v", got, want)
	}
	simtest.WaitFor(t, "the view to resolve the set", func() bool {
		_, pending := v.loadsFor(set)
		return pending == nil
	})
	if got := loads(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("resolved loads: %v, want %v", got, want)
	}
}

// TestGonePeersPairBreakersAreDropped: the breaker of a pair whose decode
// left the registry goes with it, so that no open breaker of a departed
// peer keeps the pick path looking up pair breakers for good; a pair of a
// peer at a new generation starts closed.
func TestGonePeersPairBreakersAreDropped(t *testing.T) {
	t.Parallel()
	peers := fleet(4) // prefills 00000, 00002; decodes 00001, 00003
	rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyRoundRobin}, peers)
	rt.currentView()
	rt.pairs.getOrCreate("id-peer-00000", "id-peer-00001").forceOpen(time.Now())
	rt.pairs.getOrCreate("id-peer-00002", "id-peer-00003").forceOpen(time.Now())
	if n := rt.pairs.notClosed.Load(); n != 2 {
		t.Fatalf("%d pair breakers open, want 2", n)
	}
	again := peers[3]
	again.Generation++
	snaps.Set(peers[0], peers[2], again) // decode 00001 left; 00003 re-registered
	rt.currentView()
	if n := rt.pairs.notClosed.Load(); n != 0 {
		t.Fatalf("%d pair breakers open after the decode left and the other re-registered", n)
	}
	if rt.pairs.get("id-peer-00000", "id-peer-00001") != nil {
		t.Fatal("the breaker of a departed decode's pair is still kept")
	}
	if b := rt.pairs.get("id-peer-00002", "id-peer-00003"); b == nil || b.current() != breakerClosed {
		t.Fatal("the re-registered decode's pair breaker is not kept closed")
	}
}
