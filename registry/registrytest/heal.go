package registrytest

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
)

// Heal is the heal config the contract suite's stores use: a hold shorter
// than the lease TTL, so that a sweep at the hold's end finds the decode's
// lease alive.
var Heal = registry.HealConfig{Hold: 2 * time.Second}

// testHealHold: a first failure of a pair quarantines the pair and holds
// the decode's heal plan, the decode still routable for the other
// prefills; a failure of another pair joins the plan; the hold's end
// drains the decode; the heal lifts the plan's quarantines, and a repeat
// right after it quarantines the pair for good.
func testHealHold(t *testing.T, s registry.Store) {
	p0 := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	p1 := mustRegister(t, s, Spec("p1", registry.RolePrefill)).Peer
	p2 := mustRegister(t, s, Spec("p2", registry.RolePrefill)).Peer
	dspec := Spec("d0", registry.RoleDecode)
	d := mustRegister(t, s, dspec).Peer
	for _, p := range []registry.Peer{p0, p1, p2, d} {
		mustHeartbeat(t, s, p)
	}
	report := func(prefillID string) (registry.Peer, registry.TransferOutcome) {
		t.Helper()
		got, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: d.ID,
			DecodeAgent: dspec.Ranks[0].AgentName, PrefillID: prefillID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
		if err != nil {
			t.Fatalf("report: %v", err)
		}
		return got, out
	}
	got, out := report(p0.ID)
	if out != registry.OutcomeHealPending || got.State != registry.StateReady || got.Heal.Phase != registry.HealQuarantined ||
		!reflect.DeepEqual(got.Heal.Pairs, []string{p0.ID}) {
		t.Fatalf("first failure: %s, state %s, plan %+v; want heal_pending, ready, quarantined [p0]", out, got.State, got.Heal)
	}
	if q := oneQuarantine(t, s); q.PrefillID != p0.ID || !q.Active() || !strings.Contains(q.Detail, "heal pending") {
		t.Fatalf("quarantine: %+v", q)
	}
	decodesFor := func(prefillID string) []string {
		peers, _ := s.List(ctx(t), registry.Filter{})
		qs, _ := s.Quarantines(ctx(t))
		var names []string
		for _, p := range replica.NewSnapshot(1, peers, qs, time.Now()).Routes("m").DecodesFor(prefillID) {
			names = append(names, p.Name)
		}
		return names
	}
	if a, b := decodesFor(p0.ID), decodesFor(p1.ID); len(a) != 0 || !slices.Equal(b, []string{"d0"}) {
		t.Fatalf("routes while the plan holds: p0 → %v, p1 → %v; want none, [d0]", a, b)
	}
	// A repeat of the pair changes nothing, and announces nothing: between
	// two later registrations' announcements (the first one flushes what
	// came before it), nothing names the decode. The decode's heartbeat
	// within the hold keeps it ready.
	n := len(kinds(t, s, d.ID))
	sctx, stop := context.WithCancel(ctx(t))
	changes := s.Subscribe(sctx)
	until := func(name string, quiet bool) {
		t.Helper()
		marker := mustRegister(t, s, Spec(name, registry.RolePrefill)).Peer
		for {
			select {
			case c := <-changes:
				if quiet && (slices.Contains(c.PeerIDs, d.ID) || len(c.Stale) > 0 || c.ReloadAll()) {
					t.Fatalf("the repeat announced a change: %+v", c)
				}
				if slices.Contains(c.PeerIDs, marker.ID) {
					return
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the registration of %s was never announced", name)
			}
		}
	}
	until("marker-0", false)
	if _, out := report(p0.ID); out != registry.OutcomeHealPending || len(kinds(t, s, d.ID)) != n {
		t.Fatalf("repeat: %s, events %v", out, kinds(t, s, d.ID))
	}
	until("marker-1", true)
	stop()
	if r := idleHeartbeat(t, s, d); r.Action != registry.ActionNone || r.State != registry.StateReady {
		t.Fatalf("heartbeat within the hold: %+v", r)
	}
	// Another pair fails too: it joins the plan, p2 still served.
	if got, out := report(p1.ID); out != registry.OutcomeHealPending || !reflect.DeepEqual(got.Heal.Pairs, []string{p0.ID, p1.ID}) {
		t.Fatalf("second pair: %s, plan %+v", out, got.Heal)
	}
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 2 || !slices.Equal(decodesFor(p2.ID), []string{"d0"}) {
		t.Fatalf("quarantines: %+v, p2 → %v; want both failing pairs, p2 → [d0]", qs, decodesFor(p2.ID))
	}
	// The sweep at the hold's end drains the decode.
	hold := mustGet(t, s, d.ID).Heal
	if n, err := s.ExpireLeases(ctx(t), hold.Deadline.Add(-time.Millisecond)); err != nil || n != 0 {
		t.Fatalf("sweep before the hold's end: %d, %v", n, err)
	}
	if n, err := s.ExpireLeases(ctx(t), hold.Deadline); err != nil || n != 1 {
		t.Fatalf("sweep at the hold's end: %d, %v", n, err)
	}
	if got := mustGet(t, s, d.ID); got.State != registry.StateStale || got.Heal.Phase != registry.HealDraining || len(got.Heal.Pairs) != 2 {
		t.Fatalf("after the hold: state %s, plan %+v; want stale, draining", got.State, got.Heal)
	}
	if r := idleHeartbeat(t, s, d); r.Action != registry.ActionHeal {
		t.Fatalf("idle heartbeat while draining: %+v, want heal", r)
	}
	// The heal: a new agent at generation 2 lifts the plan's quarantines.
	dspec.Ranks[0].AgentName = "d0-agent-fresh"
	if q := mustRegister(t, s, dspec).Peer; q.State != registry.StateReady || q.Generation != 2 || q.Heal.Active() {
		t.Fatalf("healed: state %s gen %d plan %+v", q.State, q.Generation, q.Heal)
	}
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 0 {
		t.Fatalf("quarantines after the heal: %+v; want none", qs)
	}
	want := []registry.EventKind{registry.EventRegistered, registry.EventReady, registry.EventQuarantined, registry.EventHealStarted,
		registry.EventQuarantined, registry.EventHealDraining, registry.EventHealActing, registry.EventReregistered, registry.EventHealed,
		registry.EventQuarantineLifted, registry.EventQuarantineLifted}
	if k := kinds(t, s, d.ID); !reflect.DeepEqual(k, want) {
		t.Fatalf("events = %v, want %v", k, want)
	}
	// The same pair failing right after the heal is quarantined with the
	// geometry difference, the decode left ready.
	got, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: d.ID,
		DecodeAgent: "d0-agent-fresh", PrefillID: p0.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
	if err != nil || out != registry.OutcomeQuarantined || got.State != registry.StateReady {
		t.Fatalf("repeat after the heal: %s, state %s, %v; want quarantined, ready", out, got.State, err)
	}
	if q := oneQuarantine(t, s); !strings.Contains(q.Detail, "geometry") {
		t.Fatalf("quarantine after the heal: %+v", q)
	}
}

// CheckHoldEndsOnHeartbeat checks, on a store that runs on clock with the
// heal config Heal, that the decode's heartbeat ends its plan's hold: it
// keeps the decode ready within the hold and drains it once the hold is
// over, with the heal_draining event, even with no lease sweep.
func CheckHoldEndsOnHeartbeat(t *testing.T, s registry.Store, clock *Clock) {
	t.Helper()
	p0, _, d, dspec := readyPairs(t, s)
	if _, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: d.ID, DecodeAgent: dspec.Ranks[0].AgentName,
		PrefillID: p0.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"}); err != nil || out != registry.OutcomeHealPending {
		t.Fatalf("first failure: %s, %v; want heal_pending", out, err)
	}
	clock.Advance(Heal.Hold / 2)
	if r := mustHeartbeat(t, s, d); r.State != registry.StateReady || r.Action != registry.ActionNone {
		t.Fatalf("heartbeat within the hold: %+v", r)
	}
	clock.Advance(Heal.Hold)
	if r := mustHeartbeat(t, s, d); r.State != registry.StateStale || r.Action != registry.ActionNone {
		t.Fatalf("heartbeat after the hold: %+v; want stale", r)
	}
	if got := mustGet(t, s, d.ID); got.Heal.Phase != registry.HealDraining || !reflect.DeepEqual(got.Heal.Pairs, []string{p0.ID}) {
		t.Fatalf("plan after the hold: %+v", got.Heal)
	}
	if k := lastKind(t, s, d.ID); k != registry.EventHealDraining {
		t.Fatalf("last event %s, want %s", k, registry.EventHealDraining)
	}
}
