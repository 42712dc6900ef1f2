package replica

import (
	"fmt"
	"strings"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// Snapshot is an immutable view of every peer and the verdict of every
// (prefill, decode) pair, built from the store and swapped atomically by a
// Mirror. The router selects pairs from it without I/O or locks.
type Snapshot struct {
	Version uint64
	BuiltAt time.Time

	peers   []*registry.Peer // sorted by name
	index   peerIndex
	classes *classTable
	// quarantined holds every quarantine record, active or on trial, by
	// (prefill ID, decode ID); preflights the last preflight of each pair.
	quarantined map[[2]string]registry.Quarantine
	preflights  map[[2]string]registry.Preflight
	// preflightBlocked holds the pairs whose last preflight, of the peers'
	// current generations, failed.
	preflightBlocked map[[2]string]bool
	// blockedPrefills are the prefills with a pair that an active
	// quarantine or a failed preflight keeps out of routing.
	blockedPrefills map[string]bool
	trials          int // how many quarantines are on trial
	models          map[string]*ModelRoutes
	modelNames      []string
	unhealthy       []*registry.Peer // sorted by name; named by Routable
	loads           *LoadTable
}

// ModelRoutes is what the router needs to serve one model: the ready
// prefills, and for each of them the ready decodes it may send KV to.
type ModelRoutes struct {
	Model    string
	Prefills []*registry.Peer
	Decodes  []*registry.Peer // every ready decode of the model, compatible or not

	index peerIndex // the snapshot's, to find a prefill's class
	// byClass groups Decodes by class; decodeClasses orders the classes as
	// the name-sorted Decodes first meet them.
	byClass       map[int][]*registry.Peer
	decodeClasses []int
	// prefillsByClass groups Prefills by class; shared maps each of those
	// classes to its compatible ready decodes, one list for every prefill
	// of the class.
	prefillsByClass map[int][]*registry.Peer
	shared          map[int][]*registry.Peer
	// both lists the ready peers of role both; own holds the private lists
	// of the prefills that may not use their class's list (role both, or
	// pairs kept out by a quarantine or a failed preflight).
	both     []*registry.Peer
	own      map[string][]*registry.Peer
	pairable bool // some prefill has a decode
}

// DecodesFor returns the ready decodes the prefill may pair with: decodes
// compatible with it and not kept out with it (a pair on trial is
// routable). Prefills of one class share one list; do not modify it.
func (m *ModelRoutes) DecodesFor(prefillID string) []*registry.Peer {
	var ds []*registry.Peer
	if own, ok := m.own[prefillID]; ok {
		ds = own
	} else if e, ok := m.index.get(prefillID); ok && m.routesPrefill(e.peer) {
		ds = m.shared[e.class]
	}
	if len(ds) == 0 {
		return nil
	}
	return ds
}

// EachDecodeList calls fn once for each of the model's ready prefills with
// what DecodesFor returns for it, without looking the prefills up: the
// way to resolve every prefill's list at fleet scale.
func (m *ModelRoutes) EachDecodeList(fn func(prefill *registry.Peer, decodes []*registry.Peer)) {
	for pc, ps := range m.prefillsByClass {
		shared := m.shared[pc]
		for _, p := range ps {
			ds := shared
			if own, ok := m.own[p.ID]; ok {
				ds = own
			}
			if len(ds) == 0 {
				ds = nil
			}
			fn(p, ds)
		}
	}
}

// routesPrefill reports whether p is one of the model's ready prefills.
func (m *ModelRoutes) routesPrefill(p *registry.Peer) bool {
	return p.Model == m.Model && p.Routable() && p.Role.Prefills()
}

// PairView is one pair of peers with its verdict, for the API.
type PairView struct {
	Prefill     *registry.Peer
	Decode      *registry.Peer
	Verdict     registry.Verdict
	Routable    bool
	Quarantined *registry.Quarantine
	// Preflight is the pair's last preflight, nil when it never ran;
	// PreflightBlocks says whether it keeps the pair out of routing (failed,
	// and of the peers' current generations).
	Preflight       *registry.Preflight
	PreflightBlocks bool
}

// NewSnapshot builds a snapshot from peers and quarantines.
func NewSnapshot(version uint64, peers []registry.Peer, quarantines []registry.Quarantine, now time.Time) *Snapshot {
	return NewSnapshotWithPreflights(version, peers, quarantines, nil, now)
}

// NewSnapshotWithPreflights builds a snapshot from peers, quarantines and
// the pairs' last preflights: a pair whose current preflight failed is
// routed no more than a quarantined one.
func NewSnapshotWithPreflights(version uint64, peers []registry.Peer, quarantines []registry.Quarantine, preflights []registry.Preflight, now time.Time) *Snapshot {
	ps := make([]*registry.Peer, len(peers))
	for i := range peers {
		ps[i] = &peers[i]
	}
	return buildSnapshot(nil, snapshotInput{version: version, peers: ps, quarantines: quarantines, preflights: preflights, now: now})
}

// Next builds the snapshot that follows s once the peers in changed have
// changed (the new record; nil for a peer that is gone), as a Mirror does:
// what the change does not touch is shared with s, which is not modified.
// A record, once in a snapshot, must not be modified: a change is a new one.
func (s *Snapshot) Next(version uint64, changed map[string]*registry.Peer, quarantines []registry.Quarantine, preflights []registry.Preflight, now time.Time) *Snapshot {
	if changed == nil {
		changed = map[string]*registry.Peer{}
	}
	return buildSnapshot(s, snapshotInput{version: version, changed: changed,
		quarantines: quarantines, preflights: preflights, now: now})
}

// Peers returns every peer, sorted by name; shared, do not modify.
func (s *Snapshot) Peers() []*registry.Peer { return s.peers }

// Peer returns the peer with the ID.
func (s *Snapshot) Peer(id string) (*registry.Peer, bool) {
	e, ok := s.index.get(id)
	return e.peer, ok
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
		return false, "no ready peers" + s.unhealthyNote("", func(registry.Role) bool { return true })
	}
	var reason string
	for _, name := range s.modelNames {
		m := s.models[name]
		switch {
		case m.pairable:
			return true, ""
		case len(m.Prefills) == 0:
			reason = "model " + name + ": no ready prefill" + s.unhealthyNote(name, registry.Role.Prefills)
		case len(m.Decodes) == 0:
			reason = "model " + name + ": no ready decode" + s.unhealthyNote(name, registry.Role.Decodes)
		default:
			reason = "model " + name + ": no compatible pair of ready peers"
		}
	}
	return false, reason
}

// unhealthyNote names the unhealthy peers of model (any model when empty)
// whose role passes serves, with their probe errors.
func (s *Snapshot) unhealthyNote(model string, serves func(registry.Role) bool) string {
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
	var prefills, decodes []*registry.Peer
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
func (s *Snapshot) pairs(prefills, decodes []*registry.Peer, limit int) ([]PairView, int) {
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
func (s *Snapshot) Verdict(prefill, decode *registry.Peer) registry.Verdict {
	ep, okP := s.index.get(prefill.ID)
	ed, okD := s.index.get(decode.ID)
	if okP && okD && prefill.ID != decode.ID && prefill.Role.Prefills() && decode.Role.Decodes() {
		if v, ok := s.classes.verdicts[[2]int{ep.class, ed.class}]; ok {
			return v
		}
	}
	return registry.CheckPair(&prefill.PeerSpec, &decode.PeerSpec)
}

// Load returns the peer's latest reported load: from the load table the
// snapshot shares with its Mirror, or from the peer as the snapshot holds
// it, whichever heartbeat is newer. ok is false for a peer that never
// heartbeated.
func (s *Snapshot) Load(p *registry.Peer) (l registry.PeerLoad, ok bool) {
	l, ok = p.ReportedLoad()
	return s.NewerLoad(l, ok)
}

// NewerLoad returns l, the load a peer's record carries (ok false: none,
// l.PeerID set all the same), or the load table's load of that peer,
// whichever heartbeat is newer: Load for callers that keep the record's load
// at hand rather than the peer.
func (s *Snapshot) NewerLoad(l registry.PeerLoad, ok bool) (registry.PeerLoad, bool) {
	if t, found := s.Loads().Get(l.PeerID); found && (!ok || t.At.After(l.At)) {
		return t, true
	}
	return l, ok
}

// Loads returns the current contents of the load table the snapshot shares
// with its Mirror; nil when there are none.
func (s *Snapshot) Loads() *LoadSet { return s.loads.Current() }

// Preflight returns the last preflight of a pair, if any.
func (s *Snapshot) Preflight(prefillID, decodeID string) (registry.Preflight, bool) {
	pf, ok := s.preflights[[2]string{prefillID, decodeID}]
	return pf, ok
}

// Preflights returns every pair's last preflight, in no particular order.
func (s *Snapshot) Preflights() []registry.Preflight {
	out := make([]registry.Preflight, 0, len(s.preflights))
	for _, pf := range s.preflights {
		out = append(out, pf)
	}
	return out
}

// Quarantined returns the quarantine record of a pair, if any.
func (s *Snapshot) Quarantined(prefillID, decodeID string) (registry.Quarantine, bool) {
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
func (s *Snapshot) Trials() []registry.Quarantine {
	if s.trials == 0 {
		return nil
	}
	out := make([]registry.Quarantine, 0, s.trials)
	for _, q := range s.quarantined {
		if q.Trial {
			out = append(out, q)
		}
	}
	return out
}
