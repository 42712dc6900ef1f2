package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// BenchmarkReportTransferFailure times a router's report of a decode's
// first failed transfer, on a fresh decode each time, with another
// prefill that can use it: the pair is quarantined, its failure recorded,
// the decode held for a heal and every replica notified.
func BenchmarkReportTransferFailure(b *testing.B) {
	ctx := context.Background()
	s, _ := registrytest.NewPGStore(b, pgstore.Config{})
	ready := func(spec registry.PeerSpec) registry.Peer { return registerReady(b, ctx, s, spec) }
	failing := ready(registrytest.Spec("p-failing", registry.RolePrefill))
	ready(registrytest.Spec("p-can", registry.RolePrefill))
	decodes := make([]registry.Peer, b.N)
	agents := make([]string, b.N)
	for i := range b.N {
		spec := registrytest.Spec(fmt.Sprintf("d%06d", i), registry.RoleDecode)
		decodes[i], agents[i] = ready(spec), spec.Ranks[0].AgentName
	}
	b.ResetTimer()
	for i := range b.N {
		_, out, err := s.ReportTransferFailure(ctx, registry.TransferFailure{DecodeID: decodes[i].ID, DecodeAgent: agents[i],
			PrefillID: failing.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
		if err != nil || out != registry.OutcomeHealPending {
			b.Fatalf("outcome %s, %v; want %s", out, err, registry.OutcomeHealPending)
		}
	}
}

// BenchmarkMarkStale times an operator's stale mark (POST
// /api/v1/peers/{id}/stale without a prefill), on a fresh decode each time.
func BenchmarkMarkStale(b *testing.B) {
	ctx := context.Background()
	s, _ := registrytest.NewPGStore(b, pgstore.Config{})
	ids := make([]string, b.N)
	for i := range b.N {
		res, err := s.Register(ctx, registrytest.Spec(fmt.Sprintf("d%06d", i), registry.RoleDecode), registry.Claim{Admin: true})
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = res.Peer.ID
	}
	b.ResetTimer()
	for i := range b.N {
		if p, err := s.MarkStale(ctx, ids[i], "benchmark: transfer failed", ""); err != nil || p.State != registry.StateStale {
			b.Fatalf("state %s, %v; want stale", p.State, err)
		}
	}
}
