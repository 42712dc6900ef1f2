package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestTransferFailureLooksForAnotherPrefillPageByPage: a decode's first
// failed transfer holds it for a heal (the failing pair quarantined, the
// decode serving the others) only when another ready prefill can use it,
// and marks it stale at once when none can. The report reads the other
// prefills a page at a time (two here, among seven of the decode's model
// that cannot use it, their page size differs), so the one that can is
// found whichever page it is on, and none is missed when there is none.
func TestTransferFailureLooksForAnotherPrefillPageByPage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		compatible bool
		want       registry.TransferOutcome
	}{
		{"one other can use the decode", true, registry.OutcomeHealPending},
		{"no other can", false, registry.OutcomeStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := registrytest.NewPGStore(t, pgstore.WithOtherPrefillsPage(pgstore.Config{}, 2))
			ready := func(spec registry.PeerSpec) registry.Peer { return registerReady(t, ctx, s, spec) }
			dspec := registrytest.Spec("d0", registry.RoleDecode)
			d := ready(dspec)
			failing := ready(registrytest.Spec("p-failing", registry.RolePrefill))
			for i := range 7 {
				spec := registrytest.Spec(fmt.Sprintf("p-other-%d", i), registry.RolePrefill)
				spec.KV.PageSize = 32
				ready(spec)
			}
			if tc.compatible {
				ready(registrytest.Spec("p-can", registry.RolePrefill))
			}
			_, out, err := s.ReportTransferFailure(ctx, registry.TransferFailure{DecodeID: d.ID, DecodeAgent: dspec.Ranks[0].AgentName,
				PrefillID: failing.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
			if err != nil || out != tc.want {
				t.Fatalf("outcome %s, %v; want %s", out, err, tc.want)
			}
		})
	}
}

// registerReady registers spec with s and heartbeats it once, so that it
// is ready.
func registerReady(tb testing.TB, ctx context.Context, s *pgstore.Store, spec registry.PeerSpec) registry.Peer {
	tb.Helper()
	res, err := s.Register(ctx, spec, registry.Claim{Admin: true})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID}); err != nil {
		tb.Fatal(err)
	}
	return res.Peer
}
