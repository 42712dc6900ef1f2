package registry_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
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
	s := registry.NewSnapshot(1, peers, qs, time.Now())
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
	if none := registry.NewSnapshot(2, peers, nil, time.Now()); none.OnTrial("id-p0", "id-d1") || none.Trials() != nil {
		t.Fatal("a snapshot without quarantines has trials")
	}
}

func TestQuarantineRule(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if registry.QuarantineExpiry(now, 0) != nil {
		t.Fatal("TTL 0 must never expire")
	}
	exp := registry.QuarantineExpiry(now, time.Minute)
	q := registry.Quarantine{PrefillID: "p", DecodeID: "d", At: now, ExpiresAt: exp}
	if _, _, ok := registry.ExpireQuarantine(q, now.Add(59*time.Second)); ok {
		t.Fatal("expired early")
	}
	trial, evs, ok := registry.ExpireQuarantine(q, now.Add(time.Minute))
	if !ok || !trial.Trial || len(evs) != 1 || evs[0].Kind != registry.EventQuarantineTrial {
		t.Fatalf("expiry: %+v %+v %v", trial, evs, ok)
	}
	if _, _, ok := registry.ExpireQuarantine(trial, now.Add(time.Hour)); ok {
		t.Fatal("a trial expired twice")
	}
	if _, ok := registry.ApplyTrialSuccess(&q, "r"); ok {
		t.Fatal("a success lifted an active quarantine")
	}
	if evs, ok := registry.ApplyTrialSuccess(&trial, "router:a"); !ok || !strings.Contains(evs[0].Message, "router:a") {
		t.Fatalf("success on trial: %+v %v", evs, ok)
	}

	spec := registrytest.Spec("d", registry.RoleDecode)
	d := registry.Peer{PeerSpec: spec, ID: "d", State: registry.StateReady, Generation: 2}
	f := registry.TransferFailure{DecodeID: "d", PrefillID: "p", DecodeAgent: spec.Ranks[0].AgentName, Reason: "r", Error: "boom"}
	later := now.Add(2 * time.Minute)
	next, events, nq, rec, out := registry.ApplyPairTransferFailure(d, nil, f, nil, &trial, later, time.Minute, time.Hour, registry.HealConfig{}, 0)
	if out != registry.OutcomeQuarantined || nq == nil || nq.Trial || !nq.At.Equal(later) || !nq.ExpiresAt.Equal(later.Add(time.Hour)) ||
		len(events) != 0 || rec != nil || next.State != registry.StateReady {
		t.Fatalf("failure on trial: %s %+v %+v", out, nq, events)
	}
	// A report about an agent the decode no longer has is outdated, trial
	// or not.
	f.DecodeAgent = "gone"
	if _, _, nq, _, out := registry.ApplyPairTransferFailure(d, nil, f, nil, &trial, later, time.Minute, time.Hour, registry.HealConfig{}, 0); out != registry.OutcomeOutdated || nq != nil {
		t.Fatalf("outdated report on trial: %s %+v", out, nq)
	}
	if _, err := registry.LiftQuarantine(nil, "p", "d", "admin"); err == nil {
		t.Fatal("lifting nothing succeeded")
	}
}
