package router

import (
	"reflect"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// TestViewFollowsPatchedSnapshots: views built from snapshots a Mirror
// patches (records a change does not touch are shared) still follow every
// change: a decode marked stale leaves the lists, a new generation resets
// the peer's breaker, a rename relabels its series and forgets the old
// name's, a new peer joins and a removed one leaves; and while the peers
// stay the same, one ID map serves consecutive views.
func TestViewFollowsPatchedSnapshots(t *testing.T) {
	t.Parallel()
	records := fleet(6) // prefills 0, 2, 4; decodes 1, 3, 5
	rt, snaps := newPickRouter(t, Config{PrefillPolicy: PolicyRoundRobin, DecodePolicy: PolicyRoundRobin, BreakerFailures: 1, BreakerCooldown: time.Hour}, records)
	s := replica.NewSnapshot(1, records, nil, time.Now())
	snaps.cur.Store(s)
	v1 := checkDecodeLists(t, rt)
	change := func(p *registry.Peer) {
		changed := map[string]*registry.Peer{p.ID: p}
		if p.Name == "" {
			changed[p.ID] = nil
		}
		s = s.Next(s.Version+1, changed, nil, nil, time.Now())
		snaps.cur.Store(s)
	}
	find := func(name string) *registry.Peer {
		for _, p := range s.Peers() {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no peer %s", name)
		return nil
	}

	stale := *find("peer-00001")
	stale.State = registry.StateStale
	change(&stale)
	v2 := checkDecodeLists(t, rt)
	if got := names(v2.refs[find("peer-00000")].decodes); got != "peer-00003 peer-00005" {
		t.Fatalf("after peer-00001 went stale, peer-00000 pairs with %s", got)
	}
	if reflect.ValueOf(v2.byID).UnsafePointer() != reflect.ValueOf(v1.byID).UnsafePointer() {
		t.Fatal("the peers stayed the same, yet the view built a new ID map")
	}
	if len(v2.byID) != 6 || v2.byID["id-peer-00003"] != v1.byID["id-peer-00003"] {
		t.Fatal("a peer's state was not carried into the next view")
	}

	// Open peer-00003's breaker, then re-register it: a new generation.
	v2.byID["id-peer-00003"].breaker.failure(false, 1, time.Now())
	regen := *find("peer-00003")
	regen.Generation++
	change(&regen)
	v3 := checkDecodeLists(t, rt)
	if st := v3.byID["id-peer-00003"]; st.breaker.current() != breakerClosed || st.gen != regen.Generation {
		t.Fatalf("after a new generation the breaker is %v at generation %d", st.breaker.current(), st.gen)
	}

	renamed := *find("peer-00005")
	renamed.Name = "peer-00005b"
	change(&renamed)
	checkDecodeLists(t, rt)
	if rt.builder.names["peer-00005"] || !rt.builder.names["peer-00005b"] || rt.builder.states["id-peer-00005"].name != "peer-00005b" {
		t.Fatalf("after a rename the router knows the names %v", rt.builder.names)
	}

	joined := registry.Peer{PeerSpec: records[1].PeerSpec, ID: "id-peer-00007", State: registry.StateReady, Generation: 1}
	joined.Name = "peer-00007"
	change(&joined)
	v5 := checkDecodeLists(t, rt)
	if got := names(v5.refs[find("peer-00000")].decodes); got != "peer-00003 peer-00005b peer-00007" {
		t.Fatalf("after peer-00007 joined, peer-00000 pairs with %s", got)
	}
	change(&registry.Peer{ID: "id-peer-00003"}) // gone
	v6 := checkDecodeLists(t, rt)
	if _, ok := v6.byID["id-peer-00003"]; ok || len(v6.byID) != 6 {
		t.Fatalf("after peer-00003 left the view knows %d peers", len(v6.byID))
	}
}
