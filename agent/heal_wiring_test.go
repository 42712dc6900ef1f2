package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// restartAction stands in for a heal action that restarts the engine: it
// gives the fake engine fresh agents (or fails), and counts its runs.
type restartAction struct {
	eng  *fakeEngine
	runs atomic.Int32
	fail error
}

func (r *restartAction) Kind() string { return "test" }

func (r *restartAction) Run(ctx context.Context, req agent.HealRequest) error {
	r.runs.Add(1)
	if r.fail != nil {
		return r.fail
	}
	return r.eng.Reregister(ctx, req.Reason)
}

// TestAgentRunsHealActionOnce: the control plane's heal instruction runs
// the action once; the agent registers the engine's new instance, and the
// peer is back at generation 2.
func TestAgentRunsHealActionOnce(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	eng := &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)}
	act := &restartAction{eng: eng}
	runAgentWith(t, agent.Config{ControlPlane: cp.url, Heal: act}, eng)
	p := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	if _, err := cp.store.MarkStale(context.Background(), p.ID, "transfer failed", "Missing NIXL destination KV memory kind"); err != nil {
		t.Fatal(err)
	}
	q := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.Generation == 2 && p.State == registry.StateReady })
	if q.Heal.Active() || act.runs.Load() != 1 {
		t.Fatalf("after the heal: plan %+v, %d runs", q.Heal, act.runs.Load())
	}
	// More heartbeats bring no second run.
	waitHeartbeats(t, cp.store, p.ID, 3)
	if n := act.runs.Load(); n != 1 {
		t.Fatalf("%d runs of the heal action", n)
	}
}

// TestAgentReportsFailedHeal: an action that fails is reported with the
// next heartbeat; the peer fails with the action's output and the action
// is not run again.
func TestAgentReportsFailedHeal(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	eng := &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)}
	act := &restartAction{eng: eng, fail: errors.New("systemctl restart sglang-d0.service: exit status 5: Unit sglang-d0.service not found.")}
	runAgentWith(t, agent.Config{ControlPlane: cp.url, Heal: act}, eng)
	p := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	if _, err := cp.store.MarkStale(context.Background(), p.ID, "transfer failed", ""); err != nil {
		t.Fatal(err)
	}
	q := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateFailed })
	if !strings.Contains(q.StateReason, "Unit sglang-d0.service not found") || q.Generation != 1 {
		t.Fatalf("failed peer: %q gen %d", q.StateReason, q.Generation)
	}
	waitHeartbeats(t, cp.store, p.ID, 3)
	if n := act.runs.Load(); n != 1 {
		t.Fatalf("%d runs of the heal action", n)
	}
}

// waitHeartbeats waits until the peer heartbeated n more times.
func waitHeartbeats(t *testing.T, s registry.Store, id string, n int) {
	t.Helper()
	var last time.Time
	seen := 0
	deadline := time.Now().Add(5 * time.Second)
	for seen < n {
		p, err := s.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if p.LastHeartbeat != nil && p.LastHeartbeat.After(last) {
			if !last.IsZero() {
				seen++
			}
			last = *p.LastHeartbeat
		}
		if time.Now().After(deadline) {
			t.Fatalf("saw %d of %d heartbeats", seen, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
