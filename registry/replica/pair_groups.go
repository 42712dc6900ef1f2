package replica

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/pdplane/pdplane/registry"
)

// GeometryClass is a set of peers that share every field a pairing rule
// reads (CompatKey), so that every pair between two classes gets the same
// verdict. ID is stable across snapshots, replicas and restarts: it is a
// hash of those fields.
type GeometryClass struct {
	ID    string
	Model string
	Shape string // the class in words, for operators
}

// PairGroup counts the pairs between one class of prefills and one class
// of decodes of the same model.
type PairGroup struct {
	Prefill, Decode   GeometryClass
	Prefills, Decodes int // prefill-capable peers of Prefill, decode-capable peers of Decode
	Pairs             int // pairs of distinct peers
	Routable          int // compatible, both ready, not under an active quarantine
	Quarantined       int // under an active quarantine
	Verdict           registry.Verdict
}

// FleetCounts are the snapshot's peers and pairs counted without reading
// any rank: what a fleet-wide summary needs.
type FleetCounts struct {
	Peers   int
	ByRole  map[registry.Role]int
	ByState map[registry.State]int
	Models  []ModelCount // sorted by model
	// Pairs counts every (prefill, decode) pair, across models too;
	// Routable and Quarantined add up the groups.
	Pairs, Routable, Quarantined int
}

// ModelCount counts the peers of one model.
type ModelCount struct {
	Model                           string
	Peers, Ready, Prefills, Decodes int
}

// classMembers are the peers of one class, by the role they can take.
type classMembers struct {
	prefills, decodes []*registry.Peer
	readyP, readyD    int
	readyBoth         int // ready peers of role both: counted on both sides
}

// members groups the snapshot's peers by class.
func (s *Snapshot) members() []classMembers {
	out := make([]classMembers, len(s.classes.keys))
	for _, p := range s.peers {
		e, _ := s.index.get(p.ID)
		m := &out[e.class]
		if p.Role.Prefills() {
			m.prefills = append(m.prefills, p)
			if p.Routable() {
				m.readyP++
			}
		}
		if p.Role.Decodes() {
			m.decodes = append(m.decodes, p)
			if p.Routable() {
				m.readyD++
			}
		}
		if p.Role == registry.RoleBoth && p.Routable() {
			m.readyBoth++
		}
	}
	return out
}

func (s *Snapshot) geometryClass(c int, rep *registry.Peer) GeometryClass {
	sum := sha256.Sum256([]byte(s.classes.keys[c]))
	return GeometryClass{ID: hex.EncodeToString(sum[:6]), Model: rep.Model, Shape: Shape(&rep.PeerSpec)}
}

// Shape describes the fields of a spec that decide its class, in words.
func Shape(p *registry.PeerSpec) string {
	parts := []string{string(p.Engine.Protocol()), fmt.Sprintf("page %d", p.KV.PageSize), p.KV.DType}
	if p.KV.IsMLA {
		parts = append(parts, "MLA")
	}
	if p.Knows(registry.FieldNumLayers) {
		parts = append(parts, fmt.Sprintf("%d layers", p.KV.NumLayers))
	}
	parts = append(parts, fmt.Sprintf("attn TP %d", p.Parallelism.AttnTPSize))
	if p.Parallelism.PPSize > 1 {
		parts = append(parts, fmt.Sprintf("PP %d", p.Parallelism.PPSize))
	}
	if p.TransferGroup != "" {
		parts = append(parts, "group "+p.TransferGroup)
	}
	switch {
	case !p.Knows(registry.FieldRanks):
		parts = append(parts, "ranks unknown")
	case len(p.Ranks) > 0:
		kinds := map[string]int{}
		for _, k := range p.Ranks[0].KVMemKinds {
			kinds[k.String()]++
		}
		names := make([]string, 0, len(kinds))
		for k := range kinds {
			names = append(names, k)
		}
		sort.Strings(names)
		parts = append(parts, fmt.Sprintf("%d ranks × %d regions %s", len(p.Ranks), len(p.Ranks[0].KVDataPtrs), strings.Join(names, "+")))
	}
	return strings.Join(parts, " · ")
}

// PairGroups groups the snapshot's pairs by (prefill class, decode class)
// of the same model, sorted by model and then by the classes' shapes. It
// costs O(peers + quarantines + classes²): it never visits the pairs one
// by one.
func (s *Snapshot) PairGroups() []PairGroup {
	ms := s.members()
	// Active quarantines counted by class pair, with whether both peers
	// are ready (then the quarantine removes a routable pair).
	type qc struct{ all, ready int }
	quarantines := map[[2]int]qc{}
	for k, q := range s.quarantined {
		if !q.Active() {
			continue
		}
		ep, okP := s.index.get(k[0])
		ed, okD := s.index.get(k[1])
		if !okP || !okD {
			continue
		}
		p, d := ep.peer, ed.peer
		key := [2]int{ep.class, ed.class}
		c := quarantines[key]
		c.all++
		if p.Routable() && d.Routable() {
			c.ready++
		}
		quarantines[key] = c
	}
	var out []PairGroup
	for pc := range ms {
		for dc := range ms {
			g, ok := s.pairGroup(ms, pc, dc)
			if !ok {
				continue
			}
			q := quarantines[[2]int{pc, dc}]
			g.Quarantined = q.all
			if g.Verdict.Compatible {
				g.Routable = ms[pc].readyP*ms[dc].readyD - q.ready
				if pc == dc {
					g.Routable -= ms[pc].readyBoth // a peer of role both never pairs with itself
				}
			}
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Prefill.Model != b.Prefill.Model {
			return a.Prefill.Model < b.Prefill.Model
		}
		if a.Prefill.Shape != b.Prefill.Shape {
			return a.Prefill.Shape < b.Prefill.Shape
		}
		return a.Decode.Shape < b.Decode.Shape
	})
	return out
}

// pairGroup is the group of classes pc and dc, without its counts of
// routable and quarantined pairs; false when the classes serve different
// models or hold no pair.
func (s *Snapshot) pairGroup(ms []classMembers, pc, dc int) (PairGroup, bool) {
	P, D := ms[pc].prefills, ms[dc].decodes
	if len(P) == 0 || len(D) == 0 || P[0].Model != D[0].Model {
		return PairGroup{}, false
	}
	n := len(P) * len(D)
	if pc == dc {
		for _, p := range P {
			if p.Role == registry.RoleBoth {
				n--
			}
		}
	}
	if n == 0 {
		return PairGroup{}, false
	}
	// Representatives that are distinct peers: with n > 0 there is one.
	rp, rd := P[0], D[0]
	if rp.ID == rd.ID {
		if len(D) > 1 {
			rd = D[1]
		} else {
			rp = P[1]
		}
	}
	return PairGroup{
		Prefill: s.geometryClass(pc, rp), Decode: s.geometryClass(dc, rd),
		Prefills: len(P), Decodes: len(D), Pairs: n, Verdict: s.Verdict(rp, rd),
	}, true
}

// PairsBetween lists the pairs whose prefill is of class prefillClass and
// whose decode is of class decodeClass (GeometryClass IDs) as a square
// block for a matrix: those of the first ⌊√limit⌋ prefills and decodes by
// name (every pair when limit <= 0), and the group's total count. Unknown
// classes hold no pair.
func (s *Snapshot) PairsBetween(prefillClass, decodeClass string, limit int) ([]PairView, int) {
	pc, dc := s.classIndex(prefillClass), s.classIndex(decodeClass)
	if pc < 0 || dc < 0 {
		return nil, 0
	}
	ms := s.members()
	P, D := ms[pc].prefills, ms[dc].decodes
	_, total := s.pairs(P, D, 1)
	if limit > 0 {
		side := max(1, int(math.Sqrt(float64(limit))))
		P, D = P[:min(side, len(P))], D[:min(side, len(D))]
	}
	out, _ := s.pairs(P, D, limit)
	return out, total
}

func (s *Snapshot) classIndex(id string) int {
	for c, k := range s.classes.keys {
		sum := sha256.Sum256([]byte(k))
		if hex.EncodeToString(sum[:6]) == id {
			return c
		}
	}
	return -1
}

// PairCount counts every (prefill-capable, decode-capable) pair of
// distinct peers, across models too: FleetCounts.Pairs, without the groups
// the rest of Counts adds up.
func (s *Snapshot) PairCount() int {
	var prefills, decodes, both int
	for _, p := range s.peers {
		if p.Role.Prefills() {
			prefills++
		}
		if p.Role.Decodes() {
			decodes++
		}
		if p.Role == registry.RoleBoth {
			both++
		}
	}
	return prefills*decodes - both
}

// Counts counts the snapshot's peers and pairs (see FleetCounts).
func (s *Snapshot) Counts() FleetCounts {
	out := FleetCounts{Peers: len(s.peers), ByRole: map[registry.Role]int{}, ByState: map[registry.State]int{}}
	models := map[string]*ModelCount{}
	for _, p := range s.peers {
		out.ByRole[p.Role]++
		out.ByState[p.State]++
		m := models[p.Model]
		if m == nil {
			m = &ModelCount{Model: p.Model}
			models[p.Model] = m
		}
		m.Peers++
		if p.Routable() {
			m.Ready++
		}
		if p.Role.Prefills() {
			m.Prefills++
		}
		if p.Role.Decodes() {
			m.Decodes++
		}
	}
	out.Pairs = s.PairCount()
	for _, m := range models {
		out.Models = append(out.Models, *m)
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })
	for _, g := range s.PairGroups() {
		out.Routable += g.Routable
		out.Quarantined += g.Quarantined
	}
	return out
}
