package router_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestQuarantineTrial: an expired quarantine puts the pair on trial; the
// router routes it again, and the outcome of its next request ends the
// quarantine (success) or renews it at once (the same failure).
func TestQuarantineTrial(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	setFault(t, d, sim.FaultMissingMemKind)
	b := setupSims(t, router.Config{}, p, d)
	const body = `{"model":"sim-model","prompt":"x","max_tokens":2}`
	ctx := context.Background()

	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	b.reg.waitStale(t, "d0")
	b.reg.reregisterSim(t, d, "marked stale")
	setFault(t, d, sim.FaultMissingMemKind)
	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	b.reg.waitQuarantine(t)
	pid, did := b.reg.id(t, "p0"), b.reg.id(t, "d0")
	simtest.WaitFor(t, "the quarantine in the snapshot", func() bool {
		_, ok := b.reg.mirror.Snapshot().Quarantined(pid, did)
		return ok
	})

	expire := func() {
		t.Helper()
		if n, err := b.reg.store.ExpireQuarantines(ctx, time.Now().Add(2*time.Hour)); err != nil || n != 1 {
			t.Fatalf("expire: %d, %v", n, err)
		}
		simtest.WaitFor(t, "the pair on trial in the snapshot", func() bool { return b.reg.mirror.Snapshot().OnTrial(pid, did) })
	}

	// On trial, still broken: the request fails and the pair is quarantined
	// again at once.
	expire()
	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("request on trial, still broken: %d %s", resp.StatusCode, out)
	}
	simtest.WaitFor(t, "the pair quarantined again", func() bool {
		q, ok := b.reg.mirror.Snapshot().Quarantined(pid, did)
		return ok && !q.Trial
	})

	// The decode is fixed (and re-registers under a fresh agent, with the
	// same geometry, which keeps the quarantine); on trial, the request
	// succeeds and the quarantine ends.
	setFault(t, d, sim.FaultNone)
	b.reg.reregisterSim(t, d, "fixed")
	if qs, _ := b.reg.store.Quarantines(ctx); len(qs) != 1 {
		t.Fatalf("quarantines after a same-geometry re-registration: %+v", qs)
	}
	expire()
	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("request on trial, fixed: %d %s", resp.StatusCode, out)
	}
	simtest.WaitFor(t, "the quarantine lifted", func() bool {
		_, ok := b.reg.mirror.Snapshot().Quarantined(pid, did)
		return !ok
	})
	evs, _ := b.reg.store.Events(ctx, registry.EventQuery{PeerID: did, Limit: 1})
	if len(evs) != 1 || evs[0].Kind != registry.EventQuarantineLifted {
		t.Fatalf("last event %+v", evs)
	}
	if resp, out := b.post(t, "/v1/completions", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the trial: %d %s", resp.StatusCode, out)
	}
}
