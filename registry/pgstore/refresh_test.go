package pgstore_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

var _ registry.Refresher = (*pgstore.Store)(nil)

// TestRefreshMatchesSeparateReads: the mirror's one-round-trip read gives
// what Get, Quarantines and Preflights give one by one: the peers that
// exist with their ranks (an unknown or malformed ID is simply absent),
// and every preflight and quarantine.
func TestRefreshMatchesSeparateReads(t *testing.T) {
	ctx := context.Background()
	s, _ := registrytest.NewPGStore(t, pgstore.Config{})
	reg := func(name string, role registry.Role) registry.Peer {
		res, err := s.Register(ctx, registrytest.Spec(name, role), registry.Claim{Admin: true})
		if err != nil {
			t.Fatal(err)
		}
		return res.Peer
	}
	p, d, other := reg("p0", registry.RolePrefill), reg("d0", registry.RoleDecode), reg("d1", registry.RoleDecode)
	if _, err := s.ReportPreflight(ctx, registrytest.PassedPreflight(p.ID, d.ID)); err != nil {
		t.Fatal(err)
	}
	const gone = "00000000-0000-4000-8000-000000000001"
	peers, qs, pfs, err := s.Refresh(ctx, []string{p.ID, d.ID, gone, "not-an-id"})
	if err != nil {
		t.Fatal(err)
	}
	if len(peers) != 2 {
		t.Fatalf("refresh returned %d peers, want p0 and d0", len(peers))
	}
	for _, got := range peers {
		want, err := s.Get(ctx, got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID == other.ID || !reflect.DeepEqual(got, want) {
			t.Fatalf("refresh gave\n%+v\nGet gives\n%+v", got, want)
		}
		if len(got.Ranks) == 0 {
			t.Fatalf("peer %s without its ranks", got.Name)
		}
	}
	wantQs, err := s.Quarantines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantPfs, err := s.Preflights(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pfs) != 1 || !reflect.DeepEqual(pfs, wantPfs) || !reflect.DeepEqual(qs, wantQs) {
		t.Fatalf("refresh: preflights %+v quarantines %+v; separate reads %+v %+v", pfs, qs, wantPfs, wantQs)
	}
}
