package registry_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

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
