package registry

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Snapshot is an immutable view of every peer and the verdict of every
// (prefill, decode) pair, built from the store and swapped atomically by a
// Mirror. The router selects pairs from it without I/O or locks.
type Snapshot struct {
	Version uint64
	BuiltAt time.Time

	peers       []*Peer // sorted by name
	byID        map[string]*Peer
	class       map[string]int // peer ID -> index into keys
	classKeys   []string       // compatKey of each class, by index
	verdicts    map[[2]int]Verdict
	quarantined map[[2]string]Quarantine // (prefill ID, decode ID), active or on trial
	preflights  map[[2]string]Preflight  // (prefill ID, decode ID), last preflight of each pair
	// preflightBlocked holds the pairs whose last preflight, of the peers'
	// current generations, failed.
	preflightBlocked map[[2]string]bool
	trials           int // how many of them are on trial
	models           map[string]*ModelRoutes
	modelNames       []string
	unhealthy        []*Peer // sorted by name; named by Routable
	loads            *LoadTable
}

// ModelRoutes is what the router needs to serve one model: the ready
// prefills, and for each of them the ready decodes it may send KV to.
type ModelRoutes struct {
	Model    string
	Prefills []*Peer
	Decodes  []*Peer // every ready decode of the model, compatible or not
	// decodesFor maps a prefill ID to the ready decodes compatible with it
	// and not quarantined with it (a pair on trial is routable).
	decodesFor map[string][]*Peer
}

// DecodesFor returns the ready decodes the prefill may pair with; shared,
// do not modify.
func (m *ModelRoutes) DecodesFor(prefillID string) []*Peer { return m.decodesFor[prefillID] }

// PairView is one pair of peers with its verdict, for the API.
type PairView struct {
	Prefill     *Peer
	Decode      *Peer
	Verdict     Verdict
	Routable    bool
	Quarantined *Quarantine
	// Preflight is the pair's last preflight, nil when it never ran;
	// PreflightBlocks says whether it keeps the pair out of routing (failed,
	// and of the peers' current generations).
	Preflight       *Preflight
	PreflightBlocks bool
}

// NewSnapshot builds a snapshot from peers and quarantines.
func NewSnapshot(version uint64, peers []Peer, quarantines []Quarantine, now time.Time) *Snapshot {
	return NewSnapshotWithPreflights(version, peers, quarantines, nil, now)
}

// NewSnapshotWithPreflights builds a snapshot from peers, quarantines and
// the pairs' last preflights: a pair whose current preflight failed is
// routed no more than a quarantined one.
func NewSnapshotWithPreflights(version uint64, peers []Peer, quarantines []Quarantine, preflights []Preflight, now time.Time) *Snapshot {
	s := &Snapshot{
		Version:     version,
		BuiltAt:     now,
		peers:       make([]*Peer, len(peers)),
		byID:        make(map[string]*Peer, len(peers)),
		class:       make(map[string]int, len(peers)),
		verdicts:    map[[2]int]Verdict{},
		quarantined: make(map[[2]string]Quarantine, len(quarantines)),
		models:      map[string]*ModelRoutes{},
	}
	keys := map[string]int{}
	reps := []*Peer{} // one representative spec per class
	for i := range peers {
		p := &peers[i]
		s.peers[i] = p
		s.byID[p.ID] = p
		k := compatKey(&p.PeerSpec)
		c, ok := keys[k]
		if !ok {
			c = len(reps)
			keys[k] = c
			reps = append(reps, p)
			s.classKeys = append(s.classKeys, k)
		}
		s.class[p.ID] = c
	}
	sort.Slice(s.peers, func(a, b int) bool { return s.peers[a].Name < s.peers[b].Name })
	for _, q := range quarantines {
		s.quarantined[[2]string{q.PrefillID, q.DecodeID}] = q
	}
	s.indexPreflights(preflights)

	// Routes over ready peers, grouped by class so that verdicts are
	// computed once per pair of classes.
	for _, p := range s.peers {
		if p.State == StateUnhealthy {
			s.unhealthy = append(s.unhealthy, p)
		}
		if !p.Routable() {
			continue
		}
		m := s.models[p.Model]
		if m == nil {
			m = &ModelRoutes{Model: p.Model, decodesFor: map[string][]*Peer{}}
			s.models[p.Model] = m
			s.modelNames = append(s.modelNames, p.Model)
		}
		if p.Role.Prefills() {
			m.Prefills = append(m.Prefills, p)
		}
		if p.Role.Decodes() {
			m.Decodes = append(m.Decodes, p)
		}
	}
	sort.Strings(s.modelNames)
	quarantinedPrefill := map[string]bool{}
	for k := range s.preflightBlocked {
		quarantinedPrefill[k[0]] = true
	}
	for k, q := range s.quarantined {
		if q.Active() {
			quarantinedPrefill[k[0]] = true
		} else {
			s.trials++
		}
	}
	for _, m := range s.models {
		// Decodes grouped by class; every prefill of one class shares the
		// same list, so building routes costs O(peers + classes²), not
		// O(prefills × decodes).
		var decodeClasses []int
		byClass := map[int][]*Peer{}
		for _, d := range m.Decodes {
			c := s.class[d.ID]
			if _, ok := byClass[c]; !ok {
				decodeClasses = append(decodeClasses, c)
			}
			byClass[c] = append(byClass[c], d)
		}
		shared := map[int][]*Peer{} // prefill class -> compatible ready decodes
		for _, pf := range m.Prefills {
			pc := s.class[pf.ID]
			ds, ok := shared[pc]
			if !ok {
				for _, dc := range decodeClasses {
					if s.classVerdict(pc, dc, reps).Compatible {
						ds = append(ds, byClass[dc]...)
					}
				}
				shared[pc] = ds
			}
			// Rare cases get a private copy: a peer of role both must not
			// pair with itself, and quarantined pairs and pairs whose
			// preflight failed are left out.
			if pf.Role.Decodes() || quarantinedPrefill[pf.ID] {
				own := make([]*Peer, 0, len(ds))
				for _, d := range ds {
					key := [2]string{pf.ID, d.ID}
					if q, isQ := s.quarantined[key]; d.ID != pf.ID && (!isQ || !q.Active()) && !s.preflightBlocked[key] {
						own = append(own, d)
					}
				}
				ds = own
			}
			if len(ds) > 0 {
				m.decodesFor[pf.ID] = ds
			}
		}
	}
	return s
}

// classVerdict is the verdict between a prefill of class pc and a decode of
// class dc. Peers of one class differ only in name and role, so the classes'
// representatives decide for everyone; roles are settled by the callers.
func (s *Snapshot) classVerdict(pc, dc int, reps []*Peer) Verdict {
	key := [2]int{pc, dc}
	if v, ok := s.verdicts[key]; ok {
		return v
	}
	rp, rd := *reps[pc], *reps[dc]
	rp.Role, rd.Role, rp.Name, rd.Name = RolePrefill, RoleDecode, "p", "d"
	v := CheckPair(&rp.PeerSpec, &rd.PeerSpec)
	s.verdicts[key] = v
	return v
}

// Peers returns every peer, sorted by name; shared, do not modify.
func (s *Snapshot) Peers() []*Peer { return s.peers }

// Peer returns the peer with the ID.
func (s *Snapshot) Peer(id string) (*Peer, bool) {
	p, ok := s.byID[id]
	return p, ok
}

// Models lists the models that have at least one ready peer, sorted.
func (s *Snapshot) Models() []string { return s.modelNames }

// Routes returns the routing view of a model, or nil when no peer of it is
// ready.
func (s *Snapshot) Routes(model string) *ModelRoutes { return s.models[model] }

// Routable reports whether at least one ready pair may be routed, and if not,
// why, naming the unhealthy peers that would otherwise serve.
func (s *Snapshot) Routable() (bool, string) {
	if len(s.modelNames) == 0 {
		return false, "no ready peers" + s.unhealthyNote("", func(Role) bool { return true })
	}
	var reason string
	for _, name := range s.modelNames {
		m := s.models[name]
		switch {
		case len(m.decodesFor) > 0:
			return true, ""
		case len(m.Prefills) == 0:
			reason = "model " + name + ": no ready prefill" + s.unhealthyNote(name, Role.Prefills)
		case len(m.Decodes) == 0:
			reason = "model " + name + ": no ready decode" + s.unhealthyNote(name, Role.Decodes)
		default:
			reason = "model " + name + ": no compatible pair of ready peers"
		}
	}
	return false, reason
}

// unhealthyNote names the unhealthy peers of model (any model when empty)
// whose role passes serves, with their probe errors.
func (s *Snapshot) unhealthyNote(model string, serves func(Role) bool) string {
	const named = 3 // a fleet-wide outage must not make a page-long answer
	var b strings.Builder
	n := 0
	for _, p := range s.unhealthy {
		if (model != "" && p.Model != model) || !serves(p.Role) {
			continue
		}
		n++
		if n > named {
			continue
		}
		if n == 1 {
			b.WriteString(" (unhealthy: ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %s: %s", p.Role, p.Name, p.StateReason)
	}
	if n > named {
		fmt.Fprintf(&b, "; and %d more", n-named)
	}
	if n > 0 {
		b.WriteString(")")
	}
	return b.String()
}

// Pairs lists every (prefill-capable, decode-capable) pair of distinct peers
// with its verdict, at most limit of them (all when limit <= 0), and the
// total count.
func (s *Snapshot) Pairs(limit int) ([]PairView, int) {
	return s.pairsFor("", limit)
}

// PairsOf is Pairs narrowed to the pairs of one prefill: O(decodes), so
// that each prefill's agent can list what it preflights in a large fleet.
func (s *Snapshot) PairsOf(prefillID string, limit int) ([]PairView, int) {
	return s.pairsFor(prefillID, limit)
}

// pairsFor lists the pairs of prefillID (of every prefill when empty).
func (s *Snapshot) pairsFor(prefillID string, limit int) ([]PairView, int) {
	var prefills, decodes []*Peer
	for _, p := range s.peers {
		if prefillID != "" && p.ID != prefillID {
			if p.Role.Decodes() {
				decodes = append(decodes, p)
			}
			continue
		}
		if p.Role.Prefills() {
			prefills = append(prefills, p)
		}
		if p.Role.Decodes() {
			decodes = append(decodes, p)
		}
	}
	return s.pairs(prefills, decodes, limit)
}

// pairs lists the pairs of distinct peers from prefills × decodes, at most
// limit of them (all when limit <= 0), and their total count.
func (s *Snapshot) pairs(prefills, decodes []*Peer, limit int) ([]PairView, int) {
	total := len(prefills) * len(decodes)
	if len(prefills) > 0 && len(decodes) > 0 {
		inDecodes := make(map[string]bool, len(decodes))
		for _, d := range decodes {
			inDecodes[d.ID] = true
		}
		for _, p := range prefills {
			if inDecodes[p.ID] {
				total-- // a peer of role both is in both lists but never pairs with itself
			}
		}
	}
	var out []PairView
	for _, p := range prefills {
		if limit > 0 && len(out) >= limit {
			break
		}
		for _, d := range decodes {
			if p.ID == d.ID {
				continue
			}
			if limit > 0 && len(out) >= limit {
				break
			}
			v := s.Verdict(p, d)
			pv := PairView{Prefill: p, Decode: d, Verdict: v}
			if q, ok := s.quarantined[[2]string{p.ID, d.ID}]; ok {
				pv.Quarantined = &q
			}
			if pf, ok := s.preflights[[2]string{p.ID, d.ID}]; ok {
				pv.Preflight = &pf
				pv.PreflightBlocks = s.preflightBlocked[[2]string{p.ID, d.ID}]
			}
			pv.Routable = v.Compatible && (pv.Quarantined == nil || !pv.Quarantined.Active()) && !pv.PreflightBlocks && p.Routable() && d.Routable()
			out = append(out, pv)
		}
	}
	return out, total
}

// Verdict returns the pairing verdict for two peers of the snapshot.
func (s *Snapshot) Verdict(prefill, decode *Peer) Verdict {
	cp, okP := s.class[prefill.ID]
	cd, okD := s.class[decode.ID]
	if okP && okD && prefill.ID != decode.ID && prefill.Role.Prefills() && decode.Role.Decodes() {
		if v, ok := s.verdicts[[2]int{cp, cd}]; ok {
			return v
		}
	}
	return CheckPair(&prefill.PeerSpec, &decode.PeerSpec)
}

// Load returns the peer's latest reported load: from the load table the
// snapshot shares with its Mirror, or from the peer as the snapshot holds
// it, whichever heartbeat is newer. ok is false for a peer that never
// heartbeated.
func (s *Snapshot) Load(p *Peer) (l PeerLoad, ok bool) {
	l, ok = p.ReportedLoad()
	return s.NewerLoad(l, ok)
}

// NewerLoad returns l, the load a peer's record carries (ok false: none,
// l.PeerID set all the same), or the load table's load of that peer,
// whichever heartbeat is newer: Load for callers that keep the record's load
// at hand rather than the peer.
func (s *Snapshot) NewerLoad(l PeerLoad, ok bool) (PeerLoad, bool) {
	set := s.Loads()
	return NewerLoad(l, ok, set, set.Slot(l.PeerID))
}

// Loads returns the current contents of the load table the snapshot shares
// with its Mirror; nil when there are none. A caller that resolved its
// peers' slots in this set passes them to NewerLoad.
func (s *Snapshot) Loads() *LoadSet { return s.loads.Current() }

// NewerLoad returns l, the load a peer's record carries (ok false: none), or
// the load in the slot of set (-1: none), whichever heartbeat is newer.
func NewerLoad(l PeerLoad, ok bool, set *LoadSet, slot int32) (PeerLoad, bool) {
	if t, found := set.At(slot); found && (!ok || t.At.After(l.At)) {
		return t, true
	}
	return l, ok
}

// indexPreflights keeps each pair's preflight and marks the pairs whose
// preflight of the peers' current generations failed.
func (s *Snapshot) indexPreflights(preflights []Preflight) {
	s.preflights = make(map[[2]string]Preflight, len(preflights))
	s.preflightBlocked = map[[2]string]bool{}
	for _, pf := range preflights {
		key := [2]string{pf.PrefillID, pf.DecodeID}
		s.preflights[key] = pf
		p, okP := s.byID[pf.PrefillID]
		d, okD := s.byID[pf.DecodeID]
		if okP && okD && pf.Failed() && pf.Current(p, d) {
			s.preflightBlocked[key] = true
		}
	}
}

// Preflight returns the last preflight of a pair, if any.
func (s *Snapshot) Preflight(prefillID, decodeID string) (Preflight, bool) {
	pf, ok := s.preflights[[2]string{prefillID, decodeID}]
	return pf, ok
}

// Preflights returns every pair's last preflight, in no particular order.
func (s *Snapshot) Preflights() []Preflight {
	out := make([]Preflight, 0, len(s.preflights))
	for _, pf := range s.preflights {
		out = append(out, pf)
	}
	return out
}

// Quarantined returns the quarantine record of a pair, if any.
func (s *Snapshot) Quarantined(prefillID, decodeID string) (Quarantine, bool) {
	q, ok := s.quarantined[[2]string{prefillID, decodeID}]
	return q, ok
}

// OnTrial reports whether the pair's quarantine expired and its next
// transfer decides whether it ends. It costs one comparison when no pair is
// on trial.
func (s *Snapshot) OnTrial(prefillID, decodeID string) bool {
	if s.trials == 0 {
		return false
	}
	q, ok := s.quarantined[[2]string{prefillID, decodeID}]
	return ok && q.Trial
}

// QuarantineCounts returns how many pairs are quarantined (kept out of
// routing) and how many are on trial (routable again until their next
// transfer decides).
func (s *Snapshot) QuarantineCounts() (active, trial int) {
	return len(s.quarantined) - s.trials, s.trials
}

// Trials returns the quarantines on trial, in no particular order.
func (s *Snapshot) Trials() []Quarantine {
	if s.trials == 0 {
		return nil
	}
	out := make([]Quarantine, 0, s.trials)
	for _, q := range s.quarantined {
		if q.Trial {
			out = append(out, q)
		}
	}
	return out
}
