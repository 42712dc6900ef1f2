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
