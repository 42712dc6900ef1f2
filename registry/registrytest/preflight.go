package registrytest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
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
	p0, p1, d, dspec := readyPairs(t, s)
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: -1}, s, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitRoutes := func(what string, want bool, cond func(replica.PairView) bool) replica.PairView {
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
	anyView := func(replica.PairView) bool { return true }
	waitRoutes("before any preflight", true, anyView)

	got, err := s.ReportPreflight(ctx(t), PassedPreflight(p0.ID, d.ID))
	want := PassedPreflight(p0.ID, d.ID)
	want.PrefillGeneration, want.DecodeGeneration = p0.Generation, d.Generation
	if err != nil || got != want {
		t.Fatalf("report passed: %+v, %v; want %+v", got, err, want)
	}
	waitRoutes("after a passed preflight", true, func(pv replica.PairView) bool { return pv.Preflight != nil && *pv.Preflight == want })

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
	waitRoutes("after the decode re-registered", true, func(pv replica.PairView) bool { return pv.Preflight != nil && pv.Preflight.Failed() })

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

// testProbe: a probe round-trips (addresses above 2^63 too) stamped with the
// peer's generation, a republish replaces it, bad fields are refused by
// name, and an unknown peer or one without a probe is ErrNotFound.
func testProbe(t *testing.T, s registry.Store) {
	d := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	if _, err := s.Probe(ctx(t), d.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("probe before any was published: %v", err)
	}
	pr := registry.Probe{PeerID: d.ID, AgentName: "d0-probe", Backend: "nixl", MemKind: registry.DRAM,
		Metadata: []byte("md"), Addr: 1<<63 + 4096, Len: 2 << 20, TransferSecret: []byte("0123456789abcdef")}
	got, err := s.PublishProbe(ctx(t), pr)
	if err != nil || got.Generation != d.Generation || got.UpdatedAt.IsZero() {
		t.Fatalf("publish: %+v, %v", got, err)
	}
	pr.AgentName, pr.Backend, pr.TransferSecret = "d0-probe-2", "tcp", nil
	if _, err := s.PublishProbe(ctx(t), pr); err != nil {
		t.Fatal(err)
	}
	back, err := s.Probe(ctx(t), d.ID)
	if err != nil || back.AgentName != "d0-probe-2" || back.Backend != "tcp" || back.Addr != pr.Addr || back.Len != pr.Len ||
		string(back.Metadata) != "md" || len(back.TransferSecret) != 0 {
		t.Fatalf("probe: %+v, %v", back, err)
	}
	bad := pr
	bad.Len = 0
	_, err = s.PublishProbe(ctx(t), bad)
	wantFieldError(t, "empty region", err, "region.len")
	bad = pr
	bad.PeerID = "6f1c3c55-1111-4222-8333-444455556666"
	if _, err := s.PublishProbe(ctx(t), bad); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("probe of an unknown peer: %v", err)
	}
}

// readyPairs registers two prefills (p0, p1) and a decode (d0) on s and
// heartbeats each, so that both pairs are ready; it returns the peers and
// the decode's spec, whose agent name a failure report names and which a
// test changes to re-register the decode.
func readyPairs(t *testing.T, s registry.Store) (p0, p1, d registry.Peer, dspec registry.PeerSpec) {
	t.Helper()
	p0 = mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	p1 = mustRegister(t, s, Spec("p1", registry.RolePrefill)).Peer
	dspec = Spec("d0", registry.RoleDecode)
	d = mustRegister(t, s, dspec).Peer
	for _, p := range []registry.Peer{p0, p1, d} {
		mustHeartbeat(t, s, p)
	}
	return p0, p1, d, dspec
}
