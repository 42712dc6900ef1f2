package registry_test

import (
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// TestApplyHeartbeatEngineHealth pins what a heartbeat makes of each state,
// with the engine healthy and down: only ready, pending and failed peers go
// unhealthy, only unhealthy (and pending, failed) ones go ready, and stale,
// draining and restarted peers are left to their own rules.
func TestApplyHeartbeatEngineHealth(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		prev       registry.State
		down       bool
		restarted  bool
		want       registry.State
		wantAction registry.Action
		wantEvent  registry.EventKind
	}{
		{registry.StateReady, false, false, registry.StateReady, registry.ActionNone, ""},
		{registry.StateReady, true, false, registry.StateUnhealthy, registry.ActionNone, registry.EventUnhealthy},
		{registry.StatePending, true, false, registry.StateUnhealthy, registry.ActionNone, registry.EventUnhealthy},
		{registry.StateFailed, true, false, registry.StateUnhealthy, registry.ActionNone, registry.EventUnhealthy},
		{registry.StatePending, false, false, registry.StateReady, registry.ActionNone, registry.EventReady},
		{registry.StateFailed, false, false, registry.StateReady, registry.ActionNone, registry.EventReady},
		{registry.StateUnhealthy, true, false, registry.StateUnhealthy, registry.ActionNone, ""},
		{registry.StateUnhealthy, false, false, registry.StateReady, registry.ActionNone, registry.EventReady},
		// A stale peer without a heal plan gets one (heal_test.go).
		{registry.StateStale, true, false, registry.StateStale, registry.ActionNone, registry.EventHealStarted},
		{registry.StateDraining, true, false, registry.StateDraining, registry.ActionNone, ""},
		{registry.StateDraining, false, false, registry.StateDraining, registry.ActionNone, ""},
		{registry.StateReady, true, true, registry.StateReady, registry.ActionReregister, ""},
	} {
		prev := registry.Peer{State: tc.prev, StateReason: "earlier"}
		if tc.prev == registry.StateFailed {
			prev.StateReason = registry.ReasonLeaseExpired // a failed heal: TestHealFailedStaysFailed
		}
		prev.InstanceID = "i1"
		hb := registry.Heartbeat{InstanceID: "i1", EngineDown: tc.down}
		if tc.down {
			hb.EngineError = "GET /health: 503 Service Unavailable"
		}
		if tc.restarted {
			hb.InstanceID = "i2"
		}
		next, reply, events := registry.ApplyHeartbeat(prev, hb, now, time.Second, registry.HealConfig{})
		var kind registry.EventKind
		if len(events) > 0 {
			kind = events[0].Kind
		}
		if next.State != tc.want || reply.State != tc.want || reply.Action != tc.wantAction || kind != tc.wantEvent {
			t.Errorf("%s, down=%v, restarted=%v: state %s reply %+v event %q; want %s, %s, %q",
				tc.prev, tc.down, tc.restarted, next.State, reply, kind, tc.want, tc.wantAction, tc.wantEvent)
		}
		if next.State == registry.StateUnhealthy && tc.prev != registry.StateUnhealthy &&
			(next.StateReason != "engine unhealthy: GET /health: 503 Service Unavailable" || events[0].Error != hb.EngineError) {
			t.Errorf("%s → unhealthy: reason %q, event %+v; want the probe error in both", tc.prev, next.StateReason, events[0])
		}
		if !next.LeaseExpiry.Equal(now.Add(time.Second)) {
			t.Errorf("%s, down=%v: lease not extended", tc.prev, tc.down)
		}
	}
}

// TestHealFailedStaysFailed: a peer whose heal failed stays failed whatever
// its heartbeats say, until an operator acts or a new instance registers;
// one whose lease ran out comes back with its heartbeats.
func TestHealFailedStaysFailed(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	for _, reason := range []string{
		"heal did not verify: no new instance by the deadline after the heal action (still generation 1)",
		"heal action failed: exit status 1",
		"heal limit reached: 3 heals in the last hour; an operator must act",
	} {
		prev := registry.Peer{State: registry.StateFailed, StateReason: reason}
		prev.InstanceID = "i1"
		for _, down := range []bool{false, true} {
			next, reply, events := registry.ApplyHeartbeat(prev, registry.Heartbeat{InstanceID: "i1", EngineDown: down}, now, time.Second, registry.HealConfig{})
			if next.State != registry.StateFailed || next.StateReason != reason || reply.State != registry.StateFailed ||
				reply.Action != registry.ActionNone || len(events) != 0 {
				t.Errorf("%q, down=%v: %s %q, reply %+v, events %+v; want failed, unchanged", reason, down, next.State, next.StateReason, reply, events)
			}
			if !next.LeaseExpiry.Equal(now.Add(time.Second)) {
				t.Errorf("%q: lease not extended", reason)
			}
		}
		// A new instance is registered at a new generation and clears it.
		spec := prev.PeerSpec
		spec.InstanceID = "i2"
		if next, _, _ := registry.Reregister(prev, spec, now, time.Second); next.State != registry.StatePending || next.Generation != prev.Generation+1 {
			t.Errorf("%q: a new instance: %s at generation %d; want pending at %d", reason, next.State, next.Generation, prev.Generation+1)
		}
	}
}
