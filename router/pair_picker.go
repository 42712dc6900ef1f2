package router

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// peerState is what the router tracks about one peer across snapshots, keyed
// by peer ID: requests in flight and the circuit breaker, its own
// observations. Whether the peer may take traffic at all is the
// registry's, and reaches the router only through the snapshot.
//
// The fields a pick reads come first, so that eligibility and load cost one
// cache line: the breaker's state word and the load baseline.
type peerState struct {
	inflight atomic.Int64
	// loadAt is the time (Unix ns) of the heartbeat whose load this router
	// last saw for the peer, and inflightAt its in-flight count then: the
	// baseline its own traffic since that heartbeat is measured from.
	loadAt, inflightAt atomic.Int64
	breaker            breaker // its state word first

	// gauge is the peer's breaker_state series, under its current name.
	gauge atomic.Pointer[prometheus.Gauge]

	// Touched only while building a view (under the view builder's lock,
	// viewBuilder.mu).
	gen  int64
	ep   *endpoint
	name string // the name gauge is labelled with

	// kv is the peer's KV events subscription and index (kv_events.go),
	// nil unless it is a prefill that publishes them and the prefill
	// policy is precise.
	kv atomic.Pointer[kvSub]
	// queued is the prompt tokens this router expects the peer to compute
	// for the prefills it sent and that have not answered yet (precise).
	queued atomic.Int64

	_ [56]byte // to 192 bytes: a state fills whole cache lines (TestPickLayout)
}

// endpoint is what the router derives from a peer's spec, once per spec.
type endpoint struct {
	name     string
	url      string
	protocol registry.Engine
	targets  [numRoutes]legTarget // where each route's legs go
	hostJSON string               // the bootstrap host as a JSON string
	port     int
	selected [2]prometheus.Counter // by role index (0 prefill, 1 decode)
}

func (e *endpoint) sameSpec(p *registry.Peer) bool {
	return e.name == p.Name && e.url == p.URL && e.protocol == p.Engine.Protocol() &&
		e.port == p.BootstrapPort && e.hostJSON == strconv.Quote(bootstrapHost(p))
}

// bootstrapHost is the host a decode reaches the prefill's bootstrap server
// at: the declared one, else the host of its URL (IPv6 in brackets, as
// SGLang's mini_lb writes it).
func bootstrapHost(p *registry.Peer) string {
	h := p.BootstrapHost
	if h == "" {
		if u, err := url.Parse(p.URL); err == nil {
			h = u.Hostname()
		}
	}
	if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
		if ip := net.ParseIP(h); ip != nil {
			h = "[" + h + "]"
		}
	}
	return h
}

// peerRef is one peer as one view sees it. A view holds its refs in one
// array, in snapshot order. A pick compares candidates through a view's
// candidate lists (cand), which hold each candidate's state beside its ref,
// and reads the ref of the one it chooses (or of one whose ID or
// generation it needs: rarely).
type peerRef struct {
	state *peerState
	// decodes are the decodes this peer may send KV to when it is the
	// prefill (replica.ModelRoutes.DecodesFor, resolved once per view);
	// lists of prefills of one compatibility class share one array.
	// decodesID is the list's ID among the view's lists.
	decodes   []cand
	peer      *registry.Peer
	ep        *endpoint
	decodesID int32
	index     int32   // in view.peers
	_         [8]byte // to peerRefSize
}

// peerRefSize is a peerRef's size: one cache line.
const peerRefSize = 64

// cand is one entry of a candidate list: a peer's ref and its state. A
// pick reads the state of every candidate it looks at (eligibility and
// load), so a list holds it beside the ref: a window of consecutive
// candidates is consecutive entries, 4 to a cache line, and one line of
// state each.
type cand struct {
	ref   *peerRef
	state *peerState
}

// candLoad is a peer's load as the newest heartbeat a view knows of
// reported it, flattened for a pick: when (Unix ns; noHeartbeat when the
// peer has reported none), its requests running and queued, its KV usage.
type candLoad struct {
	at   int64
	reqs int64
	kv   float64
}

// noHeartbeat is candLoad.at of a peer that reported no load; no
// heartbeat's time is that many nanoseconds before 1970.
const noHeartbeat = math.MinInt64

// flatLoad is l as a candLoad; ok false: no load.
func flatLoad(l registry.PeerLoad, ok bool) candLoad {
	if !ok {
		return candLoad{at: noHeartbeat}
	}
	return candLoad{at: l.At.UnixNano(), reqs: int64(l.Load.Running) + int64(l.Load.Queued), kv: l.Load.KVUsage}
}

// newer returns l or the peer's load in set, whichever heartbeat is newer
// (replica.Snapshot.NewerLoad).
func (l candLoad) newer(set *replica.LoadSet, id string) candLoad {
	if t, ok := set.Get(id); ok {
		if tl := flatLoad(t, true); tl.at > l.at {
			return tl
		}
	}
	return l
}

// view is the router's routing state derived from one registry snapshot.
// It is immutable once published, except for the atomic counters and the
// loads its picks resolve once per load refresh.
type view struct {
	snap   *replica.Snapshot
	peers  []peerRef // in snapshot order; every *peerRef of the view points here
	refs   map[*registry.Peer]*peerRef
	byID   map[string]*peerState // shared with the next view while the peers stay the same
	models map[string]*modelView
	lists  [][]cand // every candidate list of the view (prefills, decodes), by ID

	// reported is the load each peer's record carries, by peerRef.index;
	// base the lists' loads from those alone. Both are nil unless a policy
	// compares loads.
	reported []candLoad
	base     *viewLoads
	// loads holds the lists' loads as of the snapshot's latest load set
	// whose loads were resolved (loadsFor).
	loads   atomic.Pointer[viewLoads]
	loadsMu sync.Mutex
}

// viewLoads is the loads of a view's candidate lists as of one load set:
// by list ID, each aligned with its list, so that a window of consecutive
// candidates reads consecutive loads.
type viewLoads struct {
	set   *replica.LoadSet // nil: the records' loads alone (view.base)
	lists [][]candLoad
}

// loadsFor returns the lists' loads as of set. While the view has not
// resolved them, it returns the records' loads and set as pending: the
// pick's candidates look their loads in set up by ID. The first pick that
// sees a new set starts resolving them in the background: once per load
// refresh, not once per candidate, and never on a request's path (a map
// lookup per peer of the fleet: about a millisecond at 10,000).
func (v *view) loadsFor(set *replica.LoadSet) (vl *viewLoads, pending *replica.LoadSet) {
	if set == nil {
		return v.base, nil
	}
	if vl := v.loads.Load(); vl != nil && vl.set == set {
		return vl, nil
	}
	if v.loadsMu.TryLock() {
		go v.resolveLoads(set)
	}
	return v.base, set
}

// resolveLoads publishes the lists' loads as of set; the caller holds
// loadsMu, which it releases.
func (v *view) resolveLoads(set *replica.LoadSet) {
	defer v.loadsMu.Unlock()
	if vl := v.loads.Load(); vl != nil && vl.set == set {
		return
	}
	newest := make([]candLoad, len(v.peers))
	for i := range v.peers {
		newest[i] = v.reported[i].newer(set, v.peers[i].peer.ID)
	}
	v.loads.Store(v.listLoads(set, newest))
}

// listLoads lays the peers' loads (by peerRef.index) out along every list.
func (v *view) listLoads(set *replica.LoadSet, byPeer []candLoad) *viewLoads {
	total := 0
	for _, l := range v.lists {
		total += len(l)
	}
	all := make([]candLoad, 0, total)
	vl := &viewLoads{set: set, lists: make([][]candLoad, len(v.lists))}
	for id, l := range v.lists {
		at := len(all)
		for _, c := range l {
			ld := candLoad{at: noHeartbeat}
			if c.ref != nil {
				ld = byPeer[c.ref.index]
			}
			all = append(all, ld)
		}
		vl.lists[id] = all[at:len(all):len(all)]
	}
	return vl
}

// modelView is what selection needs for one model.
type modelView struct {
	name     string
	routes   *replica.ModelRoutes
	prefills []cand    // aligned with routes.Prefills
	listID   int32     // prefills' ID among the view's lists
	ring     *hashRing // for cache_aware and precise prefill selection; nil otherwise
	// tokenizers are the prefills that publish KV events: the precise
	// policy asks one of them, in turn, for a prompt's tokens.
	tokenizers []*peerRef
	tokenizeRR atomic.Uint64
	pairable   bool // at least one prefill has a compatible decode
	rr         [2]paddedCounter
	series     [numRoutes]modelSeries // its series by route (series.go)
}

// paddedCounter keeps the round-robin counters of the two roles on separate
// cache lines.
type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}

// viewBuilder owns the state carried from one view to the next.
type viewBuilder struct {
	mu     sync.Mutex
	states map[string]*peerState
	names  map[string]bool       // the peers' names in the last view: their series exist
	trials map[pairKey]time.Time // pairs on trial in the last view, by quarantine start (trial.go)
}

// currentView returns the view of the snapshot source's current snapshot,
// building it on the first request that sees a new snapshot.
func (rt *Router) currentView() *view {
	s := rt.snaps.Snapshot()
	if v := rt.view.Load(); v != nil && v.snap == s {
		return v
	}
	return rt.buildView(s)
}

func (rt *Router) buildView(s *replica.Snapshot) *view {
	b := &rt.builder
	b.mu.Lock()
	defer b.mu.Unlock()
	old := rt.view.Load()
	if old != nil && old.snap == s {
		return old
	}
	peers := s.Peers()
	v := &view{
		snap:   s,
		peers:  make([]peerRef, len(peers)),
		refs:   make(map[*registry.Peer]*peerRef, len(peers)),
		models: make(map[string]*modelView, len(s.Models())),
	}
	loadAware := rt.cfg.PrefillPolicy.loadAware() || rt.cfg.DecodePolicy.loadAware()
	if loadAware {
		v.reported = make([]candLoad, len(peers))
	}
	// A record the last view held is unchanged (a Mirror shares the records
	// a change does not touch), and so is what that view derived from it:
	// only the others are looked up by ID and checked. At 10,000 peers a
	// change then costs pointer lookups, not string maps and URL parsing.
	var last map[*registry.Peer]*peerRef
	if old != nil {
		last = old.refs
	}
	known, renamed, peersMoved := 0, false, false
	var regenerated map[string]bool // peers at a new generation: their pairs start afresh
	for i, p := range peers {
		var st *peerState
		if r := last[p]; r != nil {
			st = r.state
			known++
		} else {
			var seen bool
			st, seen = b.states[p.ID]
			switch {
			case !seen:
				st = rt.newPeerState(p)
			case st.gen != p.Generation:
				// A new generation is a fresh registration (a heal, a
				// restart): forget what the old one and its pairs did
				// wrong.
				st.breaker.reset()
				if regenerated == nil {
					regenerated = map[string]bool{}
				}
				regenerated[p.ID] = true
			}
			if seen {
				known++
			}
			st.gen = p.Generation
			if st.name != p.Name {
				renamed = renamed || st.name != ""
				g := rt.m.breakerState.WithLabelValues(p.Name)
				g.Set(float64(st.breaker.current()))
				st.gauge.Store(&g)
				st.name = p.Name
			}
			if st.ep == nil || !st.ep.sameSpec(p) {
				st.ep = rt.newEndpoint(p)
			}
		}
		v.peers[i] = peerRef{peer: p, state: st, ep: st.ep, index: int32(i)}
		if loadAware {
			v.reported[i] = flatLoad(p.ReportedLoad())
		}
		v.refs[p] = &v.peers[i]
	}
	if known == len(peers) && known == len(b.states) && !renamed {
		v.byID = b.states // the same peers: the last view's map serves
	} else {
		v.byID = make(map[string]*peerState, len(peers))
		for i := range v.peers {
			v.byID[v.peers[i].peer.ID] = v.peers[i].state
		}
		b.states = v.byID
		rt.forgetGonePeers(b, peers)
		rt.pairStats.forget(v.byID)
		peersMoved = true
	}
	if peersMoved || len(regenerated) > 0 {
		rt.pairs.resetOrForget(regenerated, v.byID)
	}
	if rt.kv != nil {
		rt.kv.sync(peers, v.byID)
	}
	if old != nil {
		rt.pairs.resetLifted(old.snap, s)
	}
	rt.armTrials(s, b)
	resolved := map[decodeList]int32{}
	for _, name := range s.Models() {
		routes := s.Routes(name)
		mv := &modelView{name: name, routes: routes}
		mv.prefills, mv.listID = v.candidates(routes.Prefills)
		routes.EachDecodeList(func(p *registry.Peer, decodes []*registry.Peer) {
			r := v.refs[p]
			r.decodes, r.decodesID = v.resolve(decodes, resolved)
			mv.pairable = mv.pairable || len(r.decodes) > 0
		})
		if (rt.cfg.PrefillPolicy == PolicyCacheAware || rt.cfg.PrefillPolicy == PolicyPrecise) && len(mv.prefills) > 0 {
			var prev *hashRing
			if old != nil {
				if om := old.models[name]; om != nil {
					prev = om.ring
				}
			}
			mv.ring = buildRing(routes.Prefills, rt.cfg.CacheAwareVirtualNodes, prev)
		}
		if rt.kv != nil {
			for _, c := range mv.prefills {
				if c.ref.peer.KVEvents.Endpoint != "" {
					mv.tokenizers = append(mv.tokenizers, c.ref)
				}
			}
		}
		v.models[name] = mv
	}
	if loadAware {
		v.base = v.listLoads(nil, v.reported)
	}
	rt.view.Store(v)
	return v
}

// decodeList names one decode list of a snapshot by its array: prefills of
// one compatibility class share it.
type decodeList struct {
	first **registry.Peer
	n     int
}

// resolve returns the view's candidate list of the decodes and its ID,
// converting each list the snapshot shares between prefills once, so that
// their prefills share the result too.
func (v *view) resolve(decodes []*registry.Peer, resolved map[decodeList]int32) ([]cand, int32) {
	if len(decodes) == 0 {
		return nil, -1
	}
	k := decodeList{&decodes[0], len(decodes)}
	if id, ok := resolved[k]; ok {
		return v.lists[id], id
	}
	c, id := v.candidates(decodes)
	resolved[k] = id
	return c, id
}

// candidates adds a candidate list of the peers to the view's lists.
func (v *view) candidates(peers []*registry.Peer) ([]cand, int32) {
	c := make([]cand, len(peers))
	for i, p := range peers {
		if r := v.refs[p]; r != nil {
			c[i] = cand{ref: r, state: r.state}
		}
	}
	v.lists = append(v.lists, c)
	return c, int32(len(v.lists) - 1)
}

// forgetGonePeers deletes the per-peer series of the names that were in the
// last view and are not in this one. A peer renamed under the same ID loses
// its old name's series too.
func (rt *Router) forgetGonePeers(b *viewBuilder, peers []*registry.Peer) {
	names := make(map[string]bool, len(peers))
	for _, p := range peers {
		names[p.Name] = true
	}
	for name := range b.names {
		if !names[name] {
			rt.m.forgetPeer(name)
		}
	}
	b.names = names
}

// newPeerState starts tracking a peer; buildView labels its breaker gauge.
func (rt *Router) newPeerState(*registry.Peer) *peerState {
	st := &peerState{}
	count := rt.m.transitionCounter("peer")
	st.breaker.onChange = func(_, to breakerState) {
		if g := st.gauge.Load(); g != nil {
			(*g).Set(float64(to))
		}
		count(to)
	}
	return st
}

func (rt *Router) newEndpoint(p *registry.Peer) *endpoint {
	base := strings.TrimRight(p.URL, "/")
	e := &endpoint{
		name:     p.Name,
		url:      p.URL,
		protocol: p.Engine.Protocol(),
		hostJSON: strconv.Quote(bootstrapHost(p)),
		port:     p.BootstrapPort,
	}
	for r := range numRoutes {
		e.targets[r] = newLegTarget(base + r.path())
	}
	e.selected[0] = rt.m.selections.WithLabelValues(string(registry.RolePrefill), p.Name)
	e.selected[1] = rt.m.selections.WithLabelValues(string(registry.RoleDecode), p.Name)
	return e
}

// hashRing is a consistent-hash ring over a model's prefills: each peer
// owns vnodes points, and a key belongs to the first point at or after its
// hash. Removing a peer moves only the keys it owned.
//
// A lookup is O(1): the hash's top bits select a bucket, and starts says
// where the bucket's points begin, so only the few points of one bucket are
// searched instead of O(log n) cache lines of the whole ring.
type hashRing struct {
	names  []string // the prefills' names in snapshot order, to reuse the ring
	points []uint64 // sorted
	owners []int32  // index into the prefills, per point
	vnodes int
	// starts[b] is the index of the first point at or after b<<shift, for
	// each of the 1<<(64-shift) buckets, then len(points).
	starts []uint32
	shift  uint
}

// ringPointsPerBucket is how many points a bucket of the ring's index holds
// on average: a few, to keep the index a quarter of the ring's size.
const ringPointsPerBucket = 4

func buildRing(prefills []*registry.Peer, vnodes int, prev *hashRing) *hashRing {
	if prev != nil && prev.vnodes == vnodes && len(prev.names) == len(prefills) {
		same := true
		for i, p := range prefills {
			if prev.names[i] != p.Name {
				same = false
				break
			}
		}
		if same {
			return prev
		}
	}
	type point struct {
		h     uint64
		owner int32
	}
	pts := make([]point, 0, len(prefills)*vnodes)
	names := make([]string, len(prefills))
	buf := make([]byte, 0, 64)
	for i, p := range prefills {
		names[i] = p.Name
		for k := range vnodes {
			buf = append(buf[:0], p.Name...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(k), 10)
			pts = append(pts, point{xxhash.Sum64(buf), int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return int(a.owner - b.owner)
	})
	r := &hashRing{names: names, points: make([]uint64, len(pts)), owners: make([]int32, len(pts)), vnodes: vnodes}
	for i, pt := range pts {
		r.points[i], r.owners[i] = pt.h, pt.owner
	}
	r.index()
	return r
}

// index builds starts: buckets enough for ringPointsPerBucket points each.
func (r *hashRing) index() {
	b := bits.Len(uint(len(r.points) / ringPointsPerBucket)) // 1<<b buckets
	r.shift = uint(64 - b)
	r.starts = make([]uint32, 1<<b+1)
	i := 0
	for k := range 1 << b {
		for i < len(r.points) && r.points[i]>>r.shift < uint64(k) {
			i++
		}
		r.starts[k] = uint32(i)
	}
	r.starts[1<<b] = uint32(len(r.points))
}

// locate returns the index of the first point at or after h, wrapping.
func (r *hashRing) locate(h uint64) int {
	k := h >> r.shift // the bucket (0 when shift is 64: one bucket)
	i, j := int(r.starts[k]), int(r.starts[k+1])
	for i < j {
		m := int(uint(i+j) >> 1)
		if r.points[m] < h {
			i = m + 1
		} else {
			j = m
		}
	}
	if i == len(r.points) {
		return 0
	}
	return i
}

// jumpHash maps key to a bucket in [0, n) (Lamping and Veach), in O(log n)
// without memory; used for cache_aware decode selection, whose candidate list
// differs per prefill.
func jumpHash(key uint64, n int) int {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

// exclusions are the peers one request has already failed on; small.
type exclusions struct {
	ids  [6]string
	n    int
	more []string
	// pairs are the pairs that failed as pairs (pdproto.BlamePair): their
	// peers stay eligible with others.
	pairs []pairKey
}

// addPair excludes the pair (prefill, decode), not its peers.
func (e *exclusions) addPair(prefill, decode string) {
	e.pairs = append(e.pairs, pairKey{prefill, decode})
}

// hasPair reports whether the pair (prefill, decode) is excluded.
func (e *exclusions) hasPair(prefill, decode string) bool {
	return len(e.pairs) > 0 && slices.Contains(e.pairs, pairKey{prefill, decode})
}

func (e *exclusions) add(id string) {
	if e.has(id) {
		return
	}
	if e.n < len(e.ids) {
		e.ids[e.n] = id
		e.n++
		return
	}
	e.more = append(e.more, id)
}

// empty reports whether nothing is excluded, without reading any ID.
func (e *exclusions) empty() bool { return e.n == 0 && len(e.more) == 0 && len(e.pairs) == 0 }

func (e *exclusions) has(id string) bool {
	for i := 0; i < e.n; i++ {
		if e.ids[i] == id {
			return true
		}
	}
	return len(e.more) > 0 && slices.Contains(e.more, id)
}

// pickCtx is what eligibility and load depend on during one pick.
type pickCtx struct {
	ex      *exclusions
	clock   func() time.Time
	now     time.Time // read from clock once a breaker that is not closed needs it
	hasNow  bool
	prefill *peerRef // set when picking a decode, for the pair breaker
	// prompt is the request's prompt as the precise policy matches it;
	// nil when it has none (the policy is another, or no engine could
	// tokenize the prompt).
	prompt *promptBlocks
	// loads are the view's lists' loads; nil when no policy compares loads.
	// pending is a load set newer than loads, whose loads the candidates
	// look up by peer ID until the view has resolved them; nil when none.
	loads   *viewLoads
	pending *replica.LoadSet
}

// time is the pick's now, read once.
func (pc *pickCtx) time() time.Time {
	if !pc.hasNow {
		pc.now, pc.hasNow = pc.clock(), true
	}
	return pc.now
}

// candidates is one candidate list as one pick sees it: the candidates and,
// aligned with them, their loads (nil when no policy compares loads).
type candidates struct {
	c     []cand
	loads []candLoad
}

// list is the view's list with that ID as this pick sees it.
func (pc *pickCtx) list(c []cand, id int32) candidates {
	cs := candidates{c: c}
	if pc.loads != nil && len(c) > 0 {
		cs.loads = pc.loads.lists[id]
	}
	return cs
}

// load is candidate i's work as this router sees it: the requests its
// engine reported running and queued at its last heartbeat, plus the change
// in this router's own requests in flight to it since the router first saw
// that heartbeat, and never fewer than those in flight; then the KV usage
// reported. Without a heartbeat it is the in-flight count alone.
func (pc *pickCtx) load(cs candidates, i int) (reqs int64, kv float64) {
	st := cs.c[i].state
	in := st.inflight.Load()
	if cs.loads == nil {
		return in, 0
	}
	l := cs.loads[i]
	if pc.pending != nil {
		l = l.newer(pc.pending, cs.c[i].ref.peer.ID)
	}
	if l.at == noHeartbeat {
		return in, 0
	}
	if seen := st.loadAt.Load(); seen != l.at && st.loadAt.CompareAndSwap(seen, l.at) {
		st.inflightAt.Store(in)
	}
	reqs = l.reqs + in - st.inflightAt.Load()
	return max(reqs, in), l.kv
}

// lessLoaded reports whether candidate a is less loaded than candidate b.
func (pc *pickCtx) lessLoaded(cs candidates, a, b int) bool {
	ra, ka := pc.load(cs, a)
	rb, kb := pc.load(cs, b)
	return ra < rb || ra == rb && ka < kb
}

// maxProbes bounds how many candidates a policy looks at before it falls
// back to a scan; the scan runs only when most candidates are ineligible
// (a fleet with most breakers open).
const maxProbes = 8

// eligible reports whether the candidate may take this attempt.
func (rt *Router) eligible(pc *pickCtx, c cand) bool {
	st := c.state
	if st == nil {
		return false
	}
	if !pc.ex.empty() && (pc.ex.has(c.ref.peer.ID) || pc.prefill != nil && pc.ex.hasPair(pc.prefill.peer.ID, c.ref.peer.ID)) {
		return false // the common pick reads no ID
	}
	if st.breaker.current() != breakerClosed && !st.breaker.available(pc.time(), rt.cfg.BreakerCooldown) {
		return false
	}
	if pc.prefill != nil && rt.pairs.notClosed.Load() > 0 {
		if b := rt.pairs.get(pc.prefill.peer.ID, c.ref.peer.ID); b != nil && !b.available(pc.time(), rt.cfg.BreakerCooldown) {
			return false
		}
	}
	return true
}

// acquire is b.acquire at the pick's now, which a closed breaker does not
// read.
func (rt *Router) acquire(pc *pickCtx, b *breaker) (ok, probe bool) {
	if b.current() == breakerClosed {
		return true, false
	}
	return b.acquire(pc.time(), rt.cfg.BreakerCooldown)
}

// next is the index after i in a list of n, wrapping: a window of
// consecutive candidates without a division per candidate.
func next(i, n int) int {
	if i++; i == n {
		return 0
	}
	return i
}

// pick chooses one candidate by policy, or nil when none is eligible.
func (rt *Router) pick(cs candidates, policy Policy, rr *atomic.Uint64, ring *hashRing, key uint64, pc *pickCtx) *peerRef {
	n := len(cs.c)
	if n == 0 {
		return nil
	}
	i := -1
	switch policy {
	case PolicyRoundRobin:
		i = rt.firstEligible(cs.c, int((rr.Add(1)-1)%uint64(n)), pc)
	case PolicyRandom:
		for range min(n, maxProbes) {
			if j := rand.IntN(n); rt.eligible(pc, cs.c[j]) {
				i = j
				break
			}
		}
	case PolicyPowerOfTwo:
		i = rt.powerOfTwo(cs, pc)
	case PolicyLeastLoad:
		i = rt.leastLoad(cs, pc)
	case PolicyCacheAware:
		i = rt.cacheAware(cs, ring, key, pc)
	case PolicyPrecise:
		i = rt.precise(cs, ring, key, pc)
	}
	if i < 0 {
		i = rt.scan(cs.c, pc)
	}
	if i < 0 {
		return nil
	}
	return cs.c[i].ref
}

// firstEligible returns the first eligible of at most maxProbes candidates
// from start on, -1 when none is.
func (rt *Router) firstEligible(c []cand, start int, pc *pickCtx) int {
	n := len(c)
	for k, i := 0, start; k < min(n, maxProbes); k, i = k+1, next(i, n) {
		if rt.eligible(pc, c[i]) {
			return i
		}
	}
	return -1
}

// scan looks at every candidate from a random start: the fallback when the
// policy's few probes found none eligible.
func (rt *Router) scan(c []cand, pc *pickCtx) int {
	n := len(c)
	for k, i := 0, rand.IntN(n); k < n; k, i = k+1, next(i, n) {
		if rt.eligible(pc, c[i]) {
			return i
		}
	}
	return -1
}

// powerOfTwo draws two distinct candidates and keeps the less loaded.
func (rt *Router) powerOfTwo(cs candidates, pc *pickCtx) int {
	n := len(cs.c)
	if n == 1 {
		if rt.eligible(pc, cs.c[0]) {
			return 0
		}
		return -1
	}
	for range maxProbes / 2 {
		i := rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		okA, okB := rt.eligible(pc, cs.c[i]), rt.eligible(pc, cs.c[j])
		switch {
		case okA && okB:
			if pc.lessLoaded(cs, j, i) {
				return j
			}
			return i
		case okA:
			return i
		case okB:
			return j
		}
	}
	return -1
}

// leastLoadWindow is how many candidates least_load compares at most.
const leastLoadWindow = maxProbes

// leastLoad keeps the least loaded eligible candidate of a window: all of
// them in a small fleet, leastLoadWindow consecutive ones from a random
// start in a large one. The random start also breaks ties at random.
// Consecutive candidates are consecutive entries of the list and of its
// loads: what a window reads besides them is one line of state each.
func (rt *Router) leastLoad(cs candidates, pc *pickCtx) int {
	n := len(cs.c)
	best := -1
	var bestReqs int64
	var bestKV float64
	for k, i := 0, rand.IntN(n); k < min(n, leastLoadWindow); k, i = k+1, next(i, n) {
		if !rt.eligible(pc, cs.c[i]) {
			continue
		}
		if reqs, kv := pc.load(cs, i); best < 0 || reqs < bestReqs || reqs == bestReqs && kv < bestKV {
			best, bestReqs, bestKV = i, reqs, kv
		}
	}
	return best
}

// cacheAware favours the peer the key hashes to, unless it is markedly busier
// than a power-of-two alternative.
func (rt *Router) cacheAware(cs candidates, ring *hashRing, key uint64, pc *pickCtx) int {
	n := len(cs.c)
	fav := -1
	if ring != nil && len(ring.points) > 0 { // prefills only
		idx := ring.locate(key)
		for k := 0; k < maxProbes && k < len(ring.points); k++ {
			if i := int(ring.owners[(idx+k)%len(ring.points)]); rt.eligible(pc, cs.c[i]) {
				fav = i
				break
			}
		}
	} else {
		fav = rt.firstEligible(cs.c, jumpHash(key, n), pc)
	}
	if fav < 0 || n == 1 {
		return fav
	}
	alt := rt.powerOfTwo(cs, pc)
	if alt < 0 || alt == fav {
		return fav
	}
	lf, la := cs.c[fav].state.inflight.Load(), cs.c[alt].state.inflight.Load()
	if lf > la+int64(rt.cfg.CacheAwareBalanceAbs) && float64(lf) > float64(la)*rt.cfg.CacheAwareBalanceRel {
		return alt
	}
	return fav
}

// pair is a selected (prefill, decode) pair with the breaker probes it holds.
type pair struct {
	p, d           *peerRef
	pProbe, dProbe bool
	pairBrk        *breaker
	pairProbe      bool
}

// pickPair selects a prefill and a decode compatible with it, both eligible,
// and takes their breakers' probes where they are half-open. It returns
// false when no such pair exists.
func (rt *Router) pickPair(v *view, mv *modelView, key uint64, prompt *promptBlocks, ex *exclusions) (pair, bool) {
	pc := pickCtx{clock: rt.cfg.Now, prompt: prompt}
	if rt.cfg.PrefillPolicy.loadAware() || rt.cfg.DecodePolicy.loadAware() {
		pc.loads, pc.pending = v.loadsFor(v.snap.Loads())
	}
	skip := *ex // prefills without an eligible decode, for this pick only
	skip.more = slices.Clone(ex.more)
	pc.ex = &skip
	for range maxProbes {
		pc.prefill = nil
		p := rt.pick(pc.list(mv.prefills, mv.listID), rt.cfg.PrefillPolicy, &mv.rr[0].Uint64, mv.ring, key, &pc)
		if p == nil {
			return pair{}, false
		}
		pc.prefill = p
		d := rt.pick(pc.list(p.decodes, p.decodesID), rt.cfg.DecodePolicy, &mv.rr[1].Uint64, nil, bits.RotateLeft64(key, 17), &pc)
		if d == nil {
			skip.add(p.peer.ID)
			continue
		}
		var pr pair
		var ok bool
		pr.p, pr.d = p, d
		if ok, pr.pProbe = rt.acquire(&pc, &p.state.breaker); !ok {
			skip.add(p.peer.ID)
			continue
		}
		if ok, pr.dProbe = rt.acquire(&pc, &d.state.breaker); !ok {
			p.state.breaker.release(pr.pProbe)
			skip.add(p.peer.ID)
			continue
		}
		if rt.pairs.notClosed.Load() > 0 {
			if b := rt.pairs.get(p.peer.ID, d.peer.ID); b != nil {
				if ok, pr.pairProbe = rt.acquire(&pc, b); !ok {
					p.state.breaker.release(pr.pProbe)
					d.state.breaker.release(pr.dProbe)
					skip.add(p.peer.ID)
					continue
				}
				pr.pairBrk = b
			}
		}
		p.ep.selected[0].Inc()
		d.ep.selected[1].Inc()
		return pr, true
	}
	return pair{}, false
}

// release gives back every probe the pair holds, for an attempt that ended
// without a verdict.
func (pr *pair) release() {
	pr.p.state.breaker.release(pr.pProbe)
	pr.d.state.breaker.release(pr.dProbe)
	if pr.pairBrk != nil {
		pr.pairBrk.release(pr.pairProbe)
	}
}

// pairKey names a (prefill ID, decode ID) pair.
type pairKey struct{ prefill, decode string }

// pairBreakers holds a breaker for each pair that has failed; pairs that
// never failed have none, so the map stays small and the common pick skips
// it entirely.
type pairBreakers struct {
	m         sync.Map // pairKey -> *breaker
	notClosed atomic.Int64
	onChange  func(from, to breakerState)
}

func (pb *pairBreakers) get(prefillID, decodeID string) *breaker {
	b, ok := pb.m.Load(pairKey{prefillID, decodeID})
	if !ok {
		return nil
	}
	return b.(*breaker)
}

func (pb *pairBreakers) getOrCreate(prefillID, decodeID string) *breaker {
	k := pairKey{prefillID, decodeID}
	if b, ok := pb.m.Load(k); ok {
		return b.(*breaker)
	}
	nb := &breaker{onChange: pb.onChange}
	b, _ := pb.m.LoadOrStore(k, nb)
	return b.(*breaker)
}

// resetOrForget closes the breakers of the pairs of the peers in
// regenerated (each re-registered: its pairs start afresh with it) and
// drops those of a peer no longer in live, in one pass.
func (pb *pairBreakers) resetOrForget(regenerated map[string]bool, live map[string]*peerState) {
	pb.m.Range(func(k, b any) bool {
		pk, br := k.(pairKey), b.(*breaker)
		_, pLive := live[pk.prefill]
		_, dLive := live[pk.decode]
		switch {
		case !pLive || !dLive:
			br.reset() // keeps notClosed and the gauges right
			pb.m.Delete(k)
		case regenerated[pk.prefill] || regenerated[pk.decode]:
			br.reset()
		}
		return true
	})
}

// resetLifted closes the breakers of the pairs quarantined in prev and no
// longer in next: an operator lifted the quarantine, or its trial
// succeeded. The router's own record of the pair's failures does not hold
// it out longer than the registry does.
func (pb *pairBreakers) resetLifted(prev, next *replica.Snapshot) {
	if pb.notClosed.Load() == 0 || prev == next {
		return
	}
	pb.m.Range(func(k, b any) bool {
		pk, br := k.(pairKey), b.(*breaker)
		if br.current() == breakerClosed {
			return true
		}
		if _, was := prev.Quarantined(pk.prefill, pk.decode); was {
			if _, is := next.Quarantined(pk.prefill, pk.decode); !is {
				br.reset()
			}
		}
		return true
	})
}

// loadAware reports whether the policy compares candidates' loads.
func (p Policy) loadAware() bool {
	return p == PolicyPowerOfTwo || p == PolicyLeastLoad || p == PolicyCacheAware || p == PolicyPrecise
}
