package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestUpdateKeepsItsConnection runs single-peer updates and transfer
// failure reports, which manage their transaction by hand (BEGIN sent with
// the locked reads, COMMIT with the writes), one after another: a peer
// that is not there is rolled back rather than left open, so the pool
// keeps serving them on the connection it has (it opens no other), outside
// any transaction, and the writes take effect.
func TestUpdateKeepsItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, _ := registrytest.NewPGStore(t, pgstore.Config{MaxConns: 1})
	res, err := s.Register(ctx, registrytest.Spec("d0", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Peer.ID
	if _, err := s.PooledTxStatus(ctx); err != nil {
		t.Fatal(err)
	}
	opened := s.ConnsOpened()
	const missing = "00000000-0000-4000-8000-000000000000"
	for range 3 {
		if _, err := s.MarkStale(ctx, missing, "test: gone", ""); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("mark stale a peer that is not there: %v, want ErrNotFound", err)
		}
		if _, err := s.Drain(ctx, missing); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("drain a peer that is not there: %v, want ErrNotFound", err)
		}
		// The decode is locked before the prefill is found missing.
		_, _, err := s.ReportTransferFailure(ctx, registry.TransferFailure{DecodeID: id, PrefillID: missing,
			Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind", Reporter: "test"})
		if !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("report a failure from a prefill that is not there: %v, want ErrNotFound", err)
		}
	}
	p, err := s.MarkStale(ctx, id, "test: transfer failed", "Missing NIXL destination KV memory kind")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != registry.StateStale {
		t.Fatalf("state %s after a stale mark, want stale", p.State)
	}
	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != registry.StateStale || got.StateReason != p.StateReason {
		t.Fatalf("stored %s (%q), answered %s (%q)", got.State, got.StateReason, p.State, p.StateReason)
	}
	status, err := s.PooledTxStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.ConnsOpened(); n != opened || status != 'I' {
		t.Fatalf("%d connections opened and transaction status %q after the updates, want %d (none replaced) and I (none open)", n, status, opened)
	}
}

// TestStaleMarkHintsOtherReplicas: a stale mark, an operator's or a
// router's transfer report, reaches another replica's subscribers with the
// hint that the peer is stale (registry.Change.Stale), so that its mirror
// takes the peer out of its routes before reading it; a report that holds
// the decode for a heal instead (another prefill can use it) gives none.
func TestStaleMarkHintsOtherReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, cfg := registrytest.NewPGStore(t, pgstore.Config{})
	b := registrytest.OpenPGStore(t, cfg)
	changes := b.Subscribe(ctx)
	hinted := func(p registry.Peer) bool { t.Helper(); return hintedChange(t, changes, p) }
	p0 := registerReady(t, ctx, a, registrytest.Spec("p0", registry.RolePrefill))
	dspec := registrytest.Spec("d0", registry.RoleDecode)
	d0 := registerReady(t, ctx, a, dspec)
	d1spec := registrytest.Spec("d1", registry.RoleDecode)
	d1 := registerReady(t, ctx, a, d1spec)
	drainChanges(changes)

	if _, err := a.MarkStale(ctx, d0.ID, "test: transfer failed", ""); err != nil {
		t.Fatal(err)
	}
	if !hinted(d0) {
		t.Fatal("an operator's stale mark reached replica b without the hint")
	}

	// A report from the only prefill marks d1 stale at once.
	report := registry.TransferFailure{DecodeID: d1.ID, DecodeAgent: d1spec.Ranks[0].AgentName, PrefillID: p0.ID,
		Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind", Reporter: "test"}
	if _, out, err := a.ReportTransferFailure(ctx, report); err != nil || out != registry.OutcomeStale {
		t.Fatalf("report: %s, %v; want %s", out, err, registry.OutcomeStale)
	}
	if !hinted(d1) {
		t.Fatal("a router's report that marked the decode stale reached replica b without the hint")
	}

	// With another prefill that can use it, a decode's first failure holds
	// it for a heal: it keeps serving, so no hint.
	registerReady(t, ctx, a, registrytest.Spec("p1", registry.RolePrefill))
	d2spec := registrytest.Spec("d2", registry.RoleDecode)
	d2 := registerReady(t, ctx, a, d2spec)
	drainChanges(changes)
	report.DecodeID, report.DecodeAgent = d2.ID, d2spec.Ranks[0].AgentName
	if _, out, err := a.ReportTransferFailure(ctx, report); err != nil || out != registry.OutcomeHealPending {
		t.Fatalf("report: %s, %v; want %s", out, err, registry.OutcomeHealPending)
	}
	if hinted(d2) {
		t.Fatal("a decode held for a heal was hinted stale")
	}
}

// hintedChange waits for a change on changes that names peer p and
// reports whether a stale hint of p came with or before it (the hint is
// sent first, in the same transaction: it cannot come later), of p's
// generation.
func hintedChange(t *testing.T, changes <-chan registry.Change, p registry.Peer) bool {
	t.Helper()
	hint := false
	deadline := time.After(5 * time.Second)
	for {
		select {
		case c := <-changes:
			for _, h := range c.Stale {
				if h.ID == p.ID {
					if h.Generation != p.Generation {
						t.Fatalf("hint of generation %d for a peer of generation %d", h.Generation, p.Generation)
					}
					hint = true
				}
			}
			if slices.Contains(c.PeerIDs, p.ID) {
				return hint
			}
		case <-deadline:
			t.Fatalf("replica b never heard of %s's change", p.Name)
		}
	}
}

// TestDrainedHoldHintsOtherReplicas: a decode held for a heal keeps
// serving, and leaves routing (stale, draining) once its hold is over,
// found by its next heartbeat or by the lease sweep. Either way the other
// replicas get the stale hint with the change, as for a stale mark, and
// take the decode out of their routes before they read it.
func TestDrainedHoldHintsOtherReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const hold = 300 * time.Millisecond
	var clock registrytest.Clock
	a, cfg := registrytest.NewPGStore(t, pgstore.Config{Heal: registry.HealConfig{Hold: hold}, Now: clock.Now})
	b := registrytest.OpenPGStore(t, cfg)
	changes := b.Subscribe(ctx)
	p0 := registerReady(t, ctx, a, registrytest.Spec("p0", registry.RolePrefill))
	registerReady(t, ctx, a, registrytest.Spec("p1", registry.RolePrefill))
	d0spec, d1spec := registrytest.Spec("d0", registry.RoleDecode), registrytest.Spec("d1", registry.RoleDecode)
	d0, d1 := registerReady(t, ctx, a, d0spec), registerReady(t, ctx, a, d1spec)
	drainChanges(changes)

	// Another prefill can use them: each decode's first failure holds it.
	for _, d := range []struct {
		p    registry.Peer
		spec registry.PeerSpec
	}{{d0, d0spec}, {d1, d1spec}} {
		report := registry.TransferFailure{DecodeID: d.p.ID, DecodeAgent: d.spec.Ranks[0].AgentName, PrefillID: p0.ID,
			Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind", Reporter: "test"}
		if _, out, err := a.ReportTransferFailure(ctx, report); err != nil || out != registry.OutcomeHealPending {
			t.Fatalf("report on %s: %s, %v; want %s", d.p.Name, out, err, registry.OutcomeHealPending)
		}
		if hintedChange(t, changes, d.p) {
			t.Fatalf("%s, held for a heal, was hinted stale", d.p.Name)
		}
	}
	clock.Advance(hold + 50*time.Millisecond)

	// d0's heartbeat finds its hold over.
	if _, err := a.Heartbeat(ctx, registry.Heartbeat{PeerID: d0.ID, InstanceID: d0.InstanceID}); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, d0.ID); err != nil || got.State != registry.StateStale || got.Heal.Phase != registry.HealDraining {
		t.Fatalf("d0 after its hold and a heartbeat: %+v, %v; want stale, draining", got.State, err)
	}
	if !hintedChange(t, changes, d0) {
		t.Fatal("a hold that a heartbeat ended reached replica b without the stale hint")
	}

	// The sweep finds d1's.
	if _, err := a.ExpireLeases(ctx, clock.Now()); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, d1.ID); err != nil || got.State != registry.StateStale || got.Heal.Phase != registry.HealDraining {
		t.Fatalf("d1 after its hold and a sweep: %+v, %v; want stale, draining", got.State, err)
	}
	if !hintedChange(t, changes, d1) {
		t.Fatal("a hold that the sweep ended reached replica b without the stale hint")
	}
}

// drainChanges drops the changes announced until none has come for a
// moment (the registrations' and first heartbeats').
func drainChanges(ch <-chan registry.Change) {
	for {
		select {
		case <-ch:
		case <-time.After(300 * time.Millisecond):
			return
		}
	}
}
