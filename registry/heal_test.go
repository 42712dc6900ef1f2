package registry_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
)

var healCfg = registry.HealConfig{DrainGrace: 10 * time.Second, VerifyTimeout: time.Minute, MaxPerHour: 3}

func healingPeer(t *testing.T, now time.Time) registry.Peer {
	t.Helper()
	p := registry.Peer{ID: "d", State: registry.StateReady, Generation: 4}
	p.InstanceID = "i1"
	p.Ranks = []registry.Rank{{AgentName: "a1"}}
	next, events := registry.ApplyStale(p, "KV transfer failed", "Missing NIXL destination KV memory kind", now, healCfg)
	if next.State != registry.StateStale || next.Heal.Phase != registry.HealDraining || next.Heal.FromGeneration != 4 ||
		!next.Heal.Deadline.Equal(now.Add(10*time.Second)) || len(events) != 2 || events[1].Kind != registry.EventHealStarted {
		t.Fatalf("stale mark: %+v %+v", next, events)
	}
	return next
}

// TestHealPlan walks a heal plan: draining while requests are in flight,
// one heal instruction and no other however many heartbeats follow, then
// the new generation brings the peer back with its timeline.
func TestHealPlan(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	p := healingPeer(t, t0)
	hb := func(p registry.Peer, at time.Time, running int) (registry.Peer, registry.HeartbeatReply, []registry.Event) {
		return registry.ApplyHeartbeat(p, registry.Heartbeat{InstanceID: "i1", Load: registry.Load{Running: running}}, at, 5*time.Second, healCfg)
	}
	p, reply, events := hb(p, t0.Add(time.Second), 2)
	if reply.Action != registry.ActionNone || p.Heal.Phase != registry.HealDraining || len(events) != 0 {
		t.Fatalf("busy draining peer: %+v %+v", reply, p.Heal)
	}
	p, reply, events = hb(p, t0.Add(3*time.Second), 0)
	if reply.Action != registry.ActionHeal || reply.Reason != "KV transfer failed" || p.Heal.Phase != registry.HealVerifying ||
		len(events) != 1 || events[0].Kind != registry.EventHealActing || !strings.HasPrefix(events[0].Message, "drained;") {
		t.Fatalf("drained: %+v %+v %+v", reply, p.Heal, events)
	}
	heals := 0
	for i := 0; i < 50; i++ {
		var r registry.HeartbeatReply
		p, r, _ = hb(p, t0.Add(4*time.Second+time.Duration(i)*time.Second), 0)
		if r.Action != registry.ActionNone {
			heals++
		}
	}
	if heals != 0 || p.State != registry.StateStale {
		t.Fatalf("%d more instructions after the first; state %s", heals, p.State)
	}
	// The engine restarted: a new instance with a fresh agent.
	spec := p.PeerSpec
	spec.InstanceID, spec.Ranks = "i2", []registry.Rank{{AgentName: "a2"}}
	healed, events, _ := registry.Reregister(p, spec, t0.Add(55*time.Second), 5*time.Second)
	if healed.State != registry.StateReady || healed.Generation != 5 || healed.Heal.Active() || len(healed.Heal.Recent) != 1 ||
		len(events) != 2 || events[1].Kind != registry.EventHealed || !strings.Contains(events[1].Message, "generation 4 → 5") {
		t.Fatalf("healed: %+v %+v", healed, events)
	}
}

// TestHealDrainGraceRunsOut: requests still in flight at the grace's end
// do not hold the heal back.
func TestHealDrainGraceRunsOut(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	p := healingPeer(t, t0)
	_, reply, events := registry.ApplyHeartbeat(p, registry.Heartbeat{InstanceID: "i1", Load: registry.Load{Running: 1, Queued: 2}},
		t0.Add(11*time.Second), 5*time.Second, healCfg)
	if reply.Action != registry.ActionHeal || !strings.Contains(events[0].Message, "3 requests in flight") {
		t.Fatalf("%+v %+v", reply, events)
	}
}

// TestHealFails: a heal action that reports failure, or an engine that
// never comes back, fails the peer once and for all.
func TestHealFails(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	p := healingPeer(t, t0)
	p, reply, _ := registry.ApplyHeartbeat(p, registry.Heartbeat{InstanceID: "i1"}, t0.Add(time.Second), 5*time.Second, healCfg)
	if reply.Action != registry.ActionHeal {
		t.Fatal(reply)
	}
	failed, reply, events := registry.ApplyHeartbeat(p, registry.Heartbeat{InstanceID: "i1", HealError: "exit status 1: unit not found"},
		t0.Add(2*time.Second), 5*time.Second, healCfg)
	if failed.State != registry.StateFailed || reply.Action != registry.ActionNone || failed.Heal.Active() ||
		!strings.Contains(failed.StateReason, "unit not found") || events[0].Kind != registry.EventHealFailed {
		t.Fatalf("action failed: %+v %+v %+v", failed, reply, events)
	}
	if _, _, ok := registry.ExpireHeal(p, t0.Add(time.Minute), registry.HealConfig{}); ok {
		t.Fatal("expired before its deadline")
	}
	failed, events, ok := registry.ExpireHeal(p, t0.Add(time.Minute+2*time.Second), registry.HealConfig{})
	if !ok || failed.State != registry.StateFailed || !strings.Contains(failed.StateReason, "still generation 4") || events[0].Kind != registry.EventHealFailed {
		t.Fatalf("verify deadline: %+v %+v", failed, events)
	}
}

// TestHealRateLimit: the fourth heal within an hour fails the peer instead.
func TestHealRateLimit(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	p := registry.Peer{ID: "d", State: registry.StateReady, Generation: 1}
	for i := 0; i < 4; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Minute)
		next, events := registry.ApplyStale(p, "failed again", "", at, healCfg)
		if i < 3 {
			if next.State != registry.StateStale || next.Heal.Phase != registry.HealDraining {
				t.Fatalf("heal %d: %+v", i+1, next)
			}
			// Healed: ready again at the next generation.
			next.State, next.Heal.Phase, next.Generation = registry.StateReady, "", next.Generation+1
			p = next
			continue
		}
		if next.State != registry.StateFailed || !strings.Contains(next.StateReason, "3 heals in the last hour") || events[1].Kind != registry.EventHealFailed {
			t.Fatalf("fourth heal: %+v %+v", next, events)
		}
	}
	// An hour after the first, a heal may start again.
	next, _ := registry.ApplyStale(p, "failed again", "", t0.Add(61*time.Minute), healCfg)
	if next.State != registry.StateStale || len(next.Heal.Recent) != 3 {
		t.Fatalf("after the hour: %+v", next.Heal)
	}
}

// TestHealHold: the first failure of a pair holds the plan with the pair
// quarantined and the decode ready; the decode's heartbeat at the hold's
// end drains it; the failure that leaves no other prefill drains it at
// once; an operator's stale mark during the hold drains it keeping the
// plan; a heal at the hour's limit fails the decode as before.
func TestHealHold(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	cfg := healCfg
	cfg.Hold = 5 * time.Second
	d := registry.Peer{ID: "d", State: registry.StateReady, Generation: 4}
	d.InstanceID = "i1"
	d.Ranks = []registry.Rank{{AgentName: "a1"}}
	fail := func(p registry.Peer, prefill string, others int) (registry.Peer, []registry.Event, *registry.Quarantine, registry.TransferOutcome) {
		next, events, q, rec, out := registry.ApplyTransferFailure(p, registry.TransferFailure{DecodeID: "d", PrefillID: prefill, Error: "e"},
			nil, t0, time.Minute, cfg, others)
		if q != nil && (rec == nil || rec.DecodeGeneration != 4) {
			t.Fatalf("quarantine without the pair's failure record: %+v", rec)
		}
		return next, events, q, out
	}
	held, events, q, out := fail(d, "p0", 2)
	if out != registry.OutcomeHealPending || held.State != registry.StateReady || held.Heal.Phase != registry.HealQuarantined ||
		q == nil || q.PrefillID != "p0" || len(events) != 1 || events[0].Kind != registry.EventHealStarted || !held.Heal.Deadline.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("first failure: %s %+v %+v %+v", out, held, q, events)
	}
	if _, _, q, out := fail(held, "p0", 2); out != registry.OutcomeHealPending || q != nil {
		t.Fatalf("repeat of the pair: %s %+v", out, q)
	}
	// The hold's end, on the decode's heartbeat.
	hb := registry.Heartbeat{InstanceID: "i1"}
	if p, _, events := registry.ApplyHeartbeat(held, hb, t0.Add(4*time.Second), time.Minute, cfg); p.State != registry.StateReady || len(events) != 0 {
		t.Fatalf("heartbeat within the hold: %+v %+v", p, events)
	}
	p, reply, events := registry.ApplyHeartbeat(held, hb, t0.Add(5*time.Second), time.Minute, cfg)
	if p.State != registry.StateStale || p.Heal.Phase != registry.HealDraining || reply.Action != registry.ActionNone ||
		len(events) != 1 || events[0].Kind != registry.EventHealDraining {
		t.Fatalf("heartbeat at the hold's end: %+v %+v %+v", p, reply, events)
	}
	// The last other prefill fails: no hold left to serve anybody.
	p, events, q, out = fail(held, "p1", 0)
	if out != registry.OutcomeStale || p.State != registry.StateStale || p.Heal.Phase != registry.HealDraining || q == nil ||
		len(p.Heal.Pairs) != 2 || len(events) != 1 || events[0].Kind != registry.EventHealDraining {
		t.Fatalf("failure leaving no other prefill: %s %+v %+v %+v", out, p, q, events)
	}
	// No other prefill from the start: stale at once, as before.
	if p, _, q, out := fail(d, "p0", 0); out != registry.OutcomeStale || p.Heal.Phase != registry.HealDraining || q != nil {
		t.Fatalf("failure with no other prefill: %s %+v %+v", out, p.Heal, q)
	}
	// An operator's stale mark during the hold drains, keeping the plan.
	if p, events := registry.ApplyStale(held, "by hand", "", t0, cfg); p.State != registry.StateStale || p.Heal.Phase != registry.HealDraining ||
		p.StateReason != "by hand" || len(p.Heal.Pairs) != 1 || len(events) != 2 {
		t.Fatalf("stale mark during the hold: %+v %+v", p, events)
	}
	// The hour's heals used up: the decode fails as before.
	limited := d
	limited.Heal.Recent = []time.Time{t0, t0, t0}
	if p, _, _, _ := fail(limited, "p0", 2); p.State != registry.StateFailed {
		t.Fatalf("failure past the hour's limit: %+v", p)
	}
	// The heal lifts the plan's quarantines.
	healed := held
	healed.Generation = 5
	if got := registry.HealedPairs(held, healed); len(got) != 1 || got[0] != "p0" {
		t.Fatalf("healed pairs: %v", got)
	}
}
