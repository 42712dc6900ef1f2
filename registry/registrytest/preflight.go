package registrytest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
)

// PassedPreflight returns a passed TCP/DRAM preflight of the pair.
func PassedPreflight(prefillID, decodeID string) registry.Preflight {
	return registry.Preflight{PrefillID: prefillID, DecodeID: decodeID, State: registry.PreflightPassed,
		Backend: "tcp", MemKind: registry.DRAM, GBps: 1.5, LatencyUS: 42.5, CheckedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// FailedPreflight returns a failed preflight of the pair with errText.
func FailedPreflight(prefillID, decodeID, errText string) registry.Preflight {
	pf := PassedPreflight(prefillID, decodeID)
	pf.State, pf.GBps, pf.LatencyUS, pf.Error = registry.PreflightFailed, 0, 0, errText
	return pf
}

// testPreflight: a preflight round-trips with the peers' generations; a
// failed one of the current generations takes the pair (only that pair) out
// of the routes of a Mirror following the store, with the error as the
// reason; a re-registration of the decode sets it aside; a passed one puts
// the pair back; bad reports are refused naming the field.
func testPreflight(t *testing.T, s registry.Store) {
	p0 := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	p1 := mustRegister(t, s, Spec("p1", registry.RolePrefill)).Peer
	dspec := Spec("d0", registry.RoleDecode)
	d := mustRegister(t, s, dspec).Peer
	for _, p := range []registry.Peer{p0, p1, d} {
		mustHeartbeat(t, s, p)
	}
	m := registry.NewMirror(registry.MirrorConfig{LoadRefresh: -1}, s, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitRoutes := func(what string, want bool, cond func(registry.PairView) bool) registry.PairView {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			snap := m.Snapshot()
			routed := false
			if r := snap.Routes("m"); r != nil {
				for _, x := range r.DecodesFor(p0.ID) {
					routed = routed || x.ID == d.ID
				}
			}
			pairs, _ := snap.Pairs(0)
			for _, pv := range pairs {
				if pv.Prefill.ID == p0.ID && pv.Decode.ID == d.ID && routed == want && pv.Routable == want && cond(pv) {
					return pv
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: pair p0 -> d0 not routable=%v within 5s", what, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	anyView := func(registry.PairView) bool { return true }
	waitRoutes("before any preflight", true, anyView)

	got, err := s.ReportPreflight(ctx(t), PassedPreflight(p0.ID, d.ID))
	want := PassedPreflight(p0.ID, d.ID)
	want.PrefillGeneration, want.DecodeGeneration = p0.Generation, d.Generation
	if err != nil || got != want {
		t.Fatalf("report passed: %+v, %v; want %+v", got, err, want)
	}
	waitRoutes("after a passed preflight", true, func(pv registry.PairView) bool { return pv.Preflight != nil && *pv.Preflight == want })

	const nixlErr = "remote spans: nixl_capi_check_remote_md: not found (-6)"
	if _, err := s.ReportPreflight(ctx(t), FailedPreflight(p0.ID, d.ID, nixlErr)); err != nil {
		t.Fatal(err)
	}
	pv := waitRoutes("after a failed preflight", false, anyView)
	if !pv.PreflightBlocks || !strings.Contains(registry.PreflightReason(*pv.Preflight), nixlErr) {
		t.Fatalf("pair view %+v: want blocked with the NIXL error as reason", pv)
	}
	if r := m.Snapshot().Routes("m"); r == nil || len(r.DecodesFor(p1.ID)) != 1 {
		t.Fatalf("the other prefill lost its decode too")
	}

	// A heal (fresh agent name: generation + 1) sets the failure aside.
	dspec.Ranks[0].AgentName = "d0-healed"
	mustRegister(t, s, dspec)
	mustHeartbeat(t, s, mustGet(t, s, d.ID))
	waitRoutes("after the decode re-registered", true, func(pv registry.PairView) bool { return pv.Preflight != nil && pv.Preflight.Failed() })

	bad := PassedPreflight(p0.ID, d.ID)
	bad.State = "maybe"
	_, err = s.ReportPreflight(ctx(t), bad)
	wantFieldError(t, "unknown state", err, "state")
	bad = FailedPreflight(p0.ID, d.ID, "")
	_, err = s.ReportPreflight(ctx(t), bad)
	wantFieldError(t, "failed without error", err, "error")
	if _, err := s.ReportPreflight(ctx(t), PassedPreflight(p0.ID, "6f1c3c55-1111-4222-8333-444455556666")); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("preflight of an unknown decode: %v", err)
	}
	if err := s.Delete(ctx(t), d.ID); err != nil {
		t.Fatal(err)
	}
	if pfs, err := s.Preflights(context.Background()); err != nil || len(pfs) != 0 {
		t.Fatalf("preflights after the decode was removed: %+v, %v", pfs, err)
	}
}
