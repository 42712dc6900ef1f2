package replica_test

import (
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// TestSnapshotTrialIsRoutable: a quarantine on trial routes its pair again
// and says so; an active one keeps it out.
func TestSnapshotTrialIsRoutable(t *testing.T) {
	t.Parallel()
	peers := []registry.Peer{
		peer(registrytest.Spec("p0", registry.RolePrefill), registry.StateReady),
		peer(registrytest.Spec("d0", registry.RoleDecode), registry.StateReady),
		peer(registrytest.Spec("d1", registry.RoleDecode), registry.StateReady),
	}
	qs := []registry.Quarantine{
		{PrefillID: "id-p0", DecodeID: "id-d0", Detail: "active"},
		{PrefillID: "id-p0", DecodeID: "id-d1", Detail: "trial", Trial: true},
	}
	s := replica.NewSnapshot(1, peers, qs, time.Now())
	if ds := s.Routes("m").DecodesFor("id-p0"); len(ds) != 1 || ds[0].Name != "d1" {
		t.Fatalf("decodes for p0 = %v; want d1 only (d0 quarantined, d1 on trial)", names(ds))
	}
	if s.OnTrial("id-p0", "id-d0") || !s.OnTrial("id-p0", "id-d1") {
		t.Fatal("OnTrial wrong")
	}
	if tr := s.Trials(); len(tr) != 1 || tr[0].DecodeID != "id-d1" {
		t.Fatalf("trials = %+v", tr)
	}
	pairs, _ := s.Pairs(0)
	for _, p := range pairs {
		if want := p.Decode.Name == "d1"; p.Routable != want || p.Quarantined == nil {
			t.Errorf("%s: routable %v, quarantine %+v", p.Decode.Name, p.Routable, p.Quarantined)
		}
	}
	if none := replica.NewSnapshot(2, peers, nil, time.Now()); none.OnTrial("id-p0", "id-d1") || none.Trials() != nil {
		t.Fatal("a snapshot without quarantines has trials")
	}
}
