package replica

import (
	"cmp"
	"hash/maphash"
	"maps"
	"slices"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// A snapshot is built from the one before it: a Mirror that learns that a
// few peers changed hands the builder those peers, and everything the
// change does not touch (the index shards of other peers, the classes, the
// routes of other models) is shared with the previous snapshot. At 10,000
// peers a stale mark then costs every replica tens of microseconds instead
// of a whole rebuild. Snapshots stay immutable: what changes is copied
// first.

// indexShards is how many parts the ID index is split into: a change
// copies the parts of the peers it touches, not the whole index.
const indexShards = 64

// indexSeed hashes IDs to shards; an index never leaves the process.
var indexSeed = maphash.MakeSeed()

// indexEntry is one peer in the index, with its compatibility class.
type indexEntry struct {
	peer  *registry.Peer
	class int
}

// peerIndex maps peer IDs to entries. Its shards are shared between
// snapshots and never written once published.
type peerIndex struct {
	shards *[indexShards]map[string]indexEntry
}

func shardOf(id string) int { return int(maphash.String(indexSeed, id) % indexShards) }

func (x peerIndex) get(id string) (indexEntry, bool) {
	if x.shards == nil {
		return indexEntry{}, false
	}
	e, ok := x.shards[shardOf(id)][id]
	return e, ok
}

// indexEditor derives a new index from a base, copying a shard the first
// time it is written.
type indexEditor struct {
	out   [indexShards]map[string]indexEntry
	owned [indexShards]bool
}

func editIndex(base peerIndex) *indexEditor {
	ed := &indexEditor{}
	if base.shards != nil {
		ed.out = *base.shards
	}
	return ed
}

func (ed *indexEditor) shard(id string) map[string]indexEntry {
	i := shardOf(id)
	if !ed.owned[i] {
		ed.out[i] = maps.Clone(ed.out[i])
		if ed.out[i] == nil {
			ed.out[i] = map[string]indexEntry{}
		}
		ed.owned[i] = true
	}
	return ed.out[i]
}

func (ed *indexEditor) set(id string, e indexEntry) { ed.shard(id)[id] = e }
func (ed *indexEditor) delete(id string)            { delete(ed.shard(id), id) }
func (ed *indexEditor) done() peerIndex             { return peerIndex{shards: &ed.out} }

// classTable numbers the compatibility classes (see CompatKey) a snapshot's
// peers fall in and caches the verdict of each pair of classes. A builder
// copies it before adding to it; a class that lost its last peer keeps its
// number until the next full build.
type classTable struct {
	numbers  map[string]int   // CompatKey -> class
	keys     []string         // CompatKey of each class
	reps     []*registry.Peer // one peer of each class: its spec decides for the class
	verdicts map[[2]int]registry.Verdict
}

// builder makes one snapshot from the previous one and what changed.
type builder struct {
	s       *Snapshot
	prev    *Snapshot
	classes *classTable
	owned   bool // classes is this build's copy
}

// peerMove is one changed peer: its record before (nil when it is new) and
// after (nil when it is gone).
type peerMove struct {
	old, new           *registry.Peer
	oldClass, newClass int
}

// snapshotInput is what a snapshot is built from.
type snapshotInput struct {
	version uint64
	// peers is every peer, for a snapshot built whole (the builder sorts
	// it by name); a patched one derives its list from the previous one
	// and changed.
	peers []*registry.Peer
	// changed holds the peers that changed since the previous snapshot:
	// the new record, nil for a peer that is gone. Nil means every peer
	// (build it whole).
	changed     map[string]*registry.Peer
	quarantines []registry.Quarantine
	preflights  []registry.Preflight
	now         time.Time
}

// buildSnapshot builds the snapshot that follows prev (nil: none, build
// from scratch) after the changes of in.
func buildSnapshot(prev *Snapshot, in snapshotInput) *Snapshot {
	if prev == nil || in.changed == nil {
		prev = &Snapshot{classes: &classTable{numbers: map[string]int{}, verdicts: map[[2]int]registry.Verdict{}}}
		in.changed = nil
		slices.SortFunc(in.peers, byName)
	}
	b := &builder{prev: prev, classes: prev.classes}
	s := &Snapshot{Version: in.version, BuiltAt: in.now, loads: prev.loads}
	b.s = s
	moves := b.indexPeers(in)
	s.peers = in.peers
	if in.changed != nil {
		all := changeOf(moves, func(*registry.Peer) bool { return true })
		s.peers = all.merge(prev.peers)
	}
	s.unhealthy = changeOf(moves, func(p *registry.Peer) bool { return p.State == registry.StateUnhealthy }).merge(prev.unhealthy)
	s.indexPairs(in.quarantines, in.preflights)
	b.routeModels(moves)
	s.classes = b.classes // last: computing verdicts may have copied it
	return s
}

// indexPeers writes the changed peers into the snapshot's index, with
// their classes, and returns the changes sorted by name.
func (b *builder) indexPeers(in snapshotInput) []peerMove {
	ed := editIndex(b.prev.index)
	var moves []peerMove
	if in.changed == nil {
		moves = make([]peerMove, 0, len(in.peers))
		for _, p := range in.peers {
			c := b.classOf(p)
			ed.set(p.ID, indexEntry{peer: p, class: c})
			moves = append(moves, peerMove{new: p, newClass: c})
		}
		b.s.index = ed.done()
		return moves // in.peers is sorted by now
	}
	moves = make([]peerMove, 0, len(in.changed))
	for id, p := range in.changed {
		var mv peerMove
		if e, ok := b.prev.index.get(id); ok {
			mv.old, mv.oldClass = e.peer, e.class
		}
		switch {
		case p != nil:
			mv.new, mv.newClass = p, b.classOf(p)
			ed.set(id, indexEntry{peer: p, class: mv.newClass})
		case mv.old != nil:
			ed.delete(id)
		default:
			continue // gone before it was seen
		}
		moves = append(moves, mv)
	}
	b.s.index = ed.done()
	slices.SortFunc(moves, func(a, c peerMove) int { return byName(a.peer(), c.peer()) })
	return moves
}

// peer is the move's new record, or its old one when the peer is gone.
func (mv peerMove) peer() *registry.Peer {
	if mv.new != nil {
		return mv.new
	}
	return mv.old
}

// byName orders peers by name, and namesakes by ID: the order of every
// list of peers a snapshot holds.
func byName(a, b *registry.Peer) int {
	if c := cmp.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// classOf returns the class of the peer's spec, numbering a new one.
func (b *builder) classOf(p *registry.Peer) int {
	k := registry.CompatKey(&p.PeerSpec)
	if c, ok := b.classes.numbers[k]; ok {
		return c
	}
	b.own()
	c := len(b.classes.keys)
	b.classes.numbers[k] = c
	b.classes.keys = append(b.classes.keys, k)
	b.classes.reps = append(b.classes.reps, p)
	return c
}

// own makes the class table this build's copy before it is written.
func (b *builder) own() {
	if b.owned {
		return
	}
	t := b.classes
	b.classes = &classTable{
		numbers:  maps.Clone(t.numbers),
		keys:     slices.Clone(t.keys),
		reps:     slices.Clone(t.reps),
		verdicts: maps.Clone(t.verdicts),
	}
	b.owned = true
}

// verdict is the verdict between a prefill of class pc and a decode of
// class dc. Peers of one class differ only in name and role, so the classes'
// representatives decide for everyone; roles are settled by the callers.
func (b *builder) verdict(pc, dc int) registry.Verdict {
	key := [2]int{pc, dc}
	if v, ok := b.classes.verdicts[key]; ok {
		return v
	}
	b.own()
	rp, rd := *b.classes.reps[pc], *b.classes.reps[dc]
	rp.Role, rd.Role, rp.Name, rd.Name = registry.RolePrefill, registry.RoleDecode, "p", "d"
	v := registry.CheckPair(&rp.PeerSpec, &rd.PeerSpec)
	b.classes.verdicts[key] = v
	return v
}

// indexPairs keeps each pair's quarantine and last preflight and notes the
// prefills some of whose pairs are kept out of routing.
func (s *Snapshot) indexPairs(quarantines []registry.Quarantine, preflights []registry.Preflight) {
	s.quarantined = make(map[[2]string]registry.Quarantine, len(quarantines))
	for _, q := range quarantines {
		s.quarantined[[2]string{q.PrefillID, q.DecodeID}] = q
	}
	s.preflights = make(map[[2]string]registry.Preflight, len(preflights))
	s.preflightBlocked = map[[2]string]bool{}
	for _, pf := range preflights {
		key := [2]string{pf.PrefillID, pf.DecodeID}
		s.preflights[key] = pf
		p, okP := s.index.get(pf.PrefillID)
		d, okD := s.index.get(pf.DecodeID)
		if okP && okD && pf.Failed() && pf.Current(p.peer, d.peer) {
			s.preflightBlocked[key] = true
		}
	}
	s.blockedPrefills = map[string]bool{}
	for k := range s.preflightBlocked {
		s.blockedPrefills[k[0]] = true
	}
	for k, q := range s.quarantined {
		if q.Active() {
			s.blockedPrefills[k[0]] = true
		} else {
			s.trials++
		}
	}
}

// samePairRules reports whether two snapshots keep the same pairs out of
// routing, so that the private decode lists of one hold for the other.
func samePairRules(a, b *Snapshot) bool {
	if len(a.blockedPrefills) != len(b.blockedPrefills) || len(a.preflightBlocked) != len(b.preflightBlocked) {
		return false
	}
	for k := range a.preflightBlocked {
		if !b.preflightBlocked[k] {
			return false
		}
	}
	active := func(s *Snapshot) int {
		n := 0
		for _, q := range s.quarantined {
			if q.Active() {
				n++
			}
		}
		return n
	}
	if active(a) != active(b) {
		return false
	}
	for k, q := range a.quarantined {
		if q.Active() {
			if o, ok := b.quarantined[k]; !ok || !o.Active() {
				return false
			}
		}
	}
	return true
}

// routeModels builds the routes of every model a move touches and shares
// the others' with the previous snapshot.
func (b *builder) routeModels(moves []peerMove) {
	s, prev := b.s, b.prev
	byModel := map[string][]peerMove{}
	for _, mv := range moves {
		if mv.old != nil && mv.old.Routable() {
			byModel[mv.old.Model] = append(byModel[mv.old.Model], mv)
		}
		if mv.new != nil && mv.new.Routable() && (mv.old == nil || !mv.old.Routable() || mv.old.Model != mv.new.Model) {
			byModel[mv.new.Model] = append(byModel[mv.new.Model], mv)
		}
	}
	rulesKept := samePairRules(prev, s)
	s.models = make(map[string]*ModelRoutes, len(prev.models)+len(byModel))
	for name, m := range prev.models {
		if _, touched := byModel[name]; touched {
			continue
		}
		cp := *m
		cp.index = s.index
		if !rulesKept {
			b.routePrivate(&cp)
		}
		s.models[name] = &cp
	}
	for name, mvs := range byModel {
		m := b.patchModel(name, prev.models[name], mvs)
		if len(m.Prefills) > 0 || len(m.Decodes) > 0 {
			s.models[name] = m
		}
	}
	s.modelNames = slices.Sorted(maps.Keys(s.models))
}

// patchModel is the routes of one model after the moves of its peers.
func (b *builder) patchModel(name string, prev *ModelRoutes, mvs []peerMove) *ModelRoutes {
	if prev == nil {
		prev = &ModelRoutes{}
	}
	m := &ModelRoutes{Model: name, index: b.s.index}
	prefills := changeOf(mvs, readyIn(name, registry.Role.Prefills))
	decodes := changeOf(mvs, readyIn(name, registry.Role.Decodes))
	both := changeOf(mvs, readyIn(name, func(r registry.Role) bool { return r == registry.RoleBoth }))
	m.Prefills = prefills.merge(prev.Prefills)
	m.Decodes = decodes.merge(prev.Decodes)
	m.both = both.merge(prev.both)
	m.prefillsByClass = prefills.mergeByClass(prev.prefillsByClass)
	decodesMoved := len(decodes.dropped)+len(decodes.added) > 0
	m.byClass, m.decodeClasses = prev.byClass, prev.decodeClasses
	if decodesMoved {
		m.byClass = decodes.mergeByClass(prev.byClass)
		m.decodeClasses = classesByFirstName(m.byClass)
	}
	m.shared = map[int][]*registry.Peer{}
	for pc := range m.prefillsByClass {
		if ds, ok := prev.shared[pc]; ok && !decodesMoved {
			m.shared[pc] = ds
			continue
		}
		var ds []*registry.Peer
		for _, dc := range m.decodeClasses {
			if b.verdict(pc, dc).Compatible {
				ds = append(ds, m.byClass[dc]...)
			}
		}
		m.shared[pc] = ds
	}
	b.routePrivate(m)
	return m
}

// listChange is what moves do to one of a snapshot's lists of peers (all
// of them, the unhealthy ones, a model's ready prefills...): the moves
// whose old record leaves it, and those whose new record joins it (by
// name, as the moves are).
type listChange struct{ dropped, added []peerMove }

// changeOf is what the moves do to the list of the records for which in
// is true.
func changeOf(mvs []peerMove, in func(*registry.Peer) bool) listChange {
	var c listChange
	for _, mv := range mvs {
		if mv.old != nil && in(mv.old) {
			c.dropped = append(c.dropped, mv)
		}
		if mv.new != nil && in(mv.new) {
			c.added = append(c.added, mv)
		}
	}
	return c
}

// readyIn selects the model's ready peers whose role serves.
func readyIn(model string, serves func(registry.Role) bool) func(*registry.Peer) bool {
	return func(p *registry.Peer) bool { return p.Routable() && p.Model == model && serves(p.Role) }
}

// merge is prev, the list as it was, after the change.
func (c listChange) merge(prev []*registry.Peer) []*registry.Peer {
	dropped := make([]*registry.Peer, len(c.dropped))
	for i, mv := range c.dropped {
		dropped[i] = mv.old
	}
	added := make([]*registry.Peer, len(c.added))
	for i, mv := range c.added {
		added[i] = mv.new
	}
	return mergeByName(prev, dropped, added)
}

// mergeByClass is prev, the list grouped by class, after the change; groups
// the change leaves alone are shared with prev.
func (c listChange) mergeByClass(prev map[int][]*registry.Peer) map[int][]*registry.Peer {
	byClass := map[int]listChange{}
	for _, mv := range c.dropped {
		g := byClass[mv.oldClass]
		g.dropped = append(g.dropped, mv)
		byClass[mv.oldClass] = g
	}
	for _, mv := range c.added {
		g := byClass[mv.newClass]
		g.added = append(g.added, mv)
		byClass[mv.newClass] = g
	}
	out := maps.Clone(prev)
	if out == nil {
		out = map[int][]*registry.Peer{}
	}
	for class, g := range byClass {
		if ps := g.merge(out[class]); len(ps) > 0 {
			out[class] = ps
		} else {
			delete(out, class)
		}
	}
	return out
}

// mergeByName is prev without dropped, with added (sorted by name) merged
// in by name. prev is not modified. A few changes are found by binary
// search, reading a handful of peers instead of every one; many are merged
// in one pass.
func mergeByName(prev, dropped, added []*registry.Peer) []*registry.Peer {
	if len(dropped) == 0 && len(added) == 0 {
		return prev
	}
	if len(dropped)+len(added) > 32 {
		return mergeAll(prev, dropped, added)
	}
	out := make([]*registry.Peer, len(prev), len(prev)+len(added))
	copy(out, prev)
	for _, p := range dropped {
		if i, found := slices.BinarySearchFunc(out, p, byName); found && out[i] == p {
			out = slices.Delete(out, i, i+1)
		}
	}
	for _, p := range added {
		i, _ := slices.BinarySearchFunc(out, p, byName)
		out = slices.Insert(out, i, p)
	}
	return out
}

// mergeAll is mergeByName in one pass over prev.
func mergeAll(prev, dropped, added []*registry.Peer) []*registry.Peer {
	drop := make(map[*registry.Peer]bool, len(dropped))
	for _, p := range dropped {
		drop[p] = true
	}
	out := make([]*registry.Peer, 0, len(prev)+len(added))
	i := 0
	for _, p := range prev {
		if drop[p] {
			continue
		}
		for i < len(added) && byName(added[i], p) < 0 {
			out = append(out, added[i])
			i++
		}
		out = append(out, p)
	}
	return append(out, added[i:]...)
}

// classesByFirstName orders decode classes as a name-sorted list of the
// decodes first meets them: by the name of each class's first decode.
func classesByFirstName(byClass map[int][]*registry.Peer) []int {
	out := slices.Collect(maps.Keys(byClass))
	slices.SortFunc(out, func(a, b int) int { return byName(byClass[a][0], byClass[b][0]) })
	return out
}

// routePrivate gives the prefills that must not use their class's shared
// list their own: a peer of role both must not pair with itself, and
// quarantined pairs and pairs whose preflight failed are left out. It
// visits those prefills only, not every prefill of the model.
func (b *builder) routePrivate(m *ModelRoutes) {
	s := b.s
	m.own = nil
	ownOf := map[int]int{} // prefill class -> prefills with their own list
	private := func(pf *registry.Peer, class int) {
		if _, done := m.own[pf.ID]; done {
			return
		}
		ds := m.shared[class]
		own := make([]*registry.Peer, 0, len(ds))
		for _, d := range ds {
			key := [2]string{pf.ID, d.ID}
			if q, isQ := s.quarantined[key]; d.ID != pf.ID && (!isQ || !q.Active()) && !s.preflightBlocked[key] {
				own = append(own, d)
			}
		}
		if m.own == nil {
			m.own = map[string][]*registry.Peer{}
		}
		m.own[pf.ID] = own
		ownOf[class]++
	}
	for _, pf := range m.both {
		e, _ := s.index.get(pf.ID)
		private(pf, e.class)
	}
	for id := range s.blockedPrefills {
		if e, ok := s.index.get(id); ok && m.routesPrefill(e.peer) {
			private(e.peer, e.class)
		}
	}
	m.pairable = false
	for _, own := range m.own {
		if len(own) > 0 {
			m.pairable = true
			return
		}
	}
	for pc, ps := range m.prefillsByClass {
		if len(ps) > ownOf[pc] && len(m.shared[pc]) > 0 {
			m.pairable = true
			return
		}
	}
}
