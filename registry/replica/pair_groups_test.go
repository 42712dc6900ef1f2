package replica_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// groupFleet is a fleet with two models, two page sizes, peers of role
// both, peers in every state and an active quarantine and a trial.
func groupFleet() ([]registry.Peer, []registry.Quarantine) {
	var peers []registry.Peer
	states := []registry.State{registry.StateReady, registry.StateReady, registry.StatePending, registry.StateUnhealthy}
	roles := []registry.Role{registry.RolePrefill, registry.RoleDecode, registry.RoleDecode, registry.RoleBoth, registry.RolePrefill}
	for i := range 40 {
		s := registrytest.Spec(fmt.Sprintf("n%02d", i), roles[i%len(roles)])
		s.Model = []string{"a", "b"}[i%2]
		if i%7 == 0 {
			s.KV.PageSize = 32
		}
		peers = append(peers, peer(s, states[i/3%len(states)]))
	}
	byName := map[string]string{}
	for _, p := range peers {
		byName[p.Name] = p.ID
	}
	// n00 (prefill, ready) and n01 (decode, ready) serve different models; pick
	// a same-model ready pair and one more for the trial.
	qs := []registry.Quarantine{
		{PrefillID: byName["n04"], DecodeID: byName["n02"], Detail: "q", At: time.Now()},
		{PrefillID: byName["n10"], DecodeID: byName["n06"], Detail: "t", At: time.Now(), Trial: true},
	}
	return peers, qs
}

// TestPairGroupsAgreeWithPairs: the groups' counts, computed per class,
// equal the counts over every pair one by one, and a group's block lists
// pairs of that group only.
func TestPairGroupsAgreeWithPairs(t *testing.T) {
	t.Parallel()
	peers, qs := groupFleet()
	s := replica.NewSnapshot(1, peers, qs, time.Now())
	all, total := s.Pairs(0)
	if total != len(all) {
		t.Fatalf("Pairs total %d, listed %d", total, len(all))
	}
	type sums struct{ pairs, routable, quarantined int }
	var want, got sums
	sameModel := 0
	for _, p := range all {
		if p.Prefill.Model != p.Decode.Model {
			continue
		}
		sameModel++
		if p.Routable {
			want.routable++
		}
		if p.Quarantined != nil && p.Quarantined.Active() {
			want.quarantined++
		}
	}
	want.pairs = sameModel
	groups := s.PairGroups()
	if len(groups) < 4 {
		t.Fatalf("%d groups, want at least two classes per model", len(groups))
	}
	for _, g := range groups {
		got.pairs += g.Pairs
		got.routable += g.Routable
		got.quarantined += g.Quarantined
		if g.Prefill.Model != g.Decode.Model {
			t.Errorf("group across models: %+v", g)
		}
		block, gTotal := s.PairsBetween(g.Prefill.ID, g.Decode.ID, 0)
		if gTotal != g.Pairs || len(block) != g.Pairs {
			t.Errorf("group %s→%s counts %d pairs, PairsBetween lists %d of %d", g.Prefill.Shape, g.Decode.Shape, g.Pairs, len(block), gTotal)
		}
		routable := 0
		for _, p := range block {
			if p.Verdict.Compatible != g.Verdict.Compatible {
				t.Errorf("pair %s→%s verdict %v in a group whose verdict is %v", p.Prefill.Name, p.Decode.Name, p.Verdict.Compatible, g.Verdict.Compatible)
			}
			if p.Routable {
				routable++
			}
		}
		if routable != g.Routable {
			t.Errorf("group %s→%s: %d routable counted per class, %d one by one", g.Prefill.Shape, g.Decode.Shape, g.Routable, routable)
		}
	}
	if got != want {
		t.Errorf("groups add up to %+v, the pairs one by one to %+v", got, want)
	}
	if want.quarantined != 1 || want.routable == 0 {
		t.Fatalf("the fleet does not exercise the counts: %+v", want)
	}
	c := s.Counts()
	if c.Pairs != total || c.Routable != want.routable || c.Quarantined != want.quarantined || c.Peers != len(peers) {
		t.Errorf("Counts() = %+v, want %d pairs, %d routable, %d quarantined, %d peers", c, total, want.routable, want.quarantined, len(peers))
	}
}

// TestPairsBetweenIsASquareBlock: with a limit, a group's pairs are those
// of its first ⌊√limit⌋ prefills and decodes, so that a matrix of them is
// full; unknown classes hold no pair.
func TestPairsBetweenIsASquareBlock(t *testing.T) {
	t.Parallel()
	var peers []registry.Peer
	for i := range 30 {
		peers = append(peers, peer(registrytest.Spec(fmt.Sprintf("p%02d", i), registry.RolePrefill), registry.StateReady),
			peer(registrytest.Spec(fmt.Sprintf("d%02d", i), registry.RoleDecode), registry.StateReady))
	}
	s := replica.NewSnapshot(1, peers, nil, time.Now())
	groups := s.PairGroups()
	if len(groups) != 1 || groups[0].Pairs != 900 || groups[0].Routable != 900 {
		t.Fatalf("groups = %+v, want one of 900 routable pairs", groups)
	}
	block, total := s.PairsBetween(groups[0].Prefill.ID, groups[0].Decode.ID, 100)
	rows, cols := map[string]bool{}, map[string]bool{}
	for _, p := range block {
		rows[p.Prefill.Name], cols[p.Decode.Name] = true, true
	}
	if total != 900 || len(block) != 100 || len(rows) != 10 || len(cols) != 10 {
		t.Errorf("PairsBetween(limit 100) = %d pairs over %d×%d, total %d; want 100 over 10×10 of 900", len(block), len(rows), len(cols), total)
	}
	if _, n := s.PairsBetween("feed", groups[0].Decode.ID, 0); n != 0 {
		t.Errorf("an unknown class holds %d pairs", n)
	}
}
