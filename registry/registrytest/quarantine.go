package registrytest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// QuarantineTTL is the quarantine TTL the contract suite's stores use.
const QuarantineTTL = 30 * time.Minute

func oneQuarantine(t *testing.T, s registry.Store) registry.Quarantine {
	t.Helper()
	qs, err := s.Quarantines(ctx(t))
	if err != nil || len(qs) != 1 {
		t.Fatalf("quarantines: %+v, %v; want one", qs, err)
	}
	return qs[0]
}

func lastKind(t *testing.T, s registry.Store, id string) registry.EventKind {
	t.Helper()
	k := kinds(t, s, id)
	return k[len(k)-1]
}

// testQuarantineTrial: a quarantine expires after the TTL, the pair goes
// on trial, a failure on trial quarantines it again at once, and a success
// on trial ends it.
func testQuarantineTrial(t *testing.T, s registry.Store) {
	pf, d, dspec := newPair(t, s)
	quarantinePair(t, s, pf.ID, &dspec, d.ID)
	q := oneQuarantine(t, s)
	if q.Trial || q.ExpiresAt == nil || !q.ExpiresAt.Equal(q.At.Add(QuarantineTTL)) {
		t.Fatalf("new quarantine: %+v; want active, expiring a TTL after it began", q)
	}
	// Not yet expired: nothing changes, and a success does not lift an
	// active quarantine.
	if n, err := s.ExpireQuarantines(ctx(t), q.At.Add(QuarantineTTL-time.Second)); err != nil || n != 0 {
		t.Fatalf("expire before the TTL: %d, %v", n, err)
	}
	if lifted, err := s.ReportTransferSuccess(ctx(t), pf.ID, d.ID, "test"); err != nil || lifted {
		t.Fatalf("success on an active quarantine: %v, %v; want nothing lifted", lifted, err)
	}
	if oneQuarantine(t, s).Trial {
		t.Fatal("quarantine on trial before it expired")
	}
	// Expired: on trial, once.
	later := q.At.Add(QuarantineTTL + time.Second)
	if n, err := s.ExpireQuarantines(ctx(t), later); err != nil || n != 1 {
		t.Fatalf("expire after the TTL: %d, %v; want 1", n, err)
	}
	if n, _ := s.ExpireQuarantines(ctx(t), later); n != 0 {
		t.Fatalf("second sweep changed %d quarantines", n)
	}
	if q := oneQuarantine(t, s); !q.Trial {
		t.Fatalf("expired quarantine not on trial: %+v", q)
	}
	if k := lastKind(t, s, d.ID); k != registry.EventQuarantineTrial {
		t.Fatalf("last event %s, want %s", k, registry.EventQuarantineTrial)
	}
	// The next transfer fails: quarantined again at once, decode untouched.
	got, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: d.ID,
		DecodeAgent: dspec.Ranks[0].AgentName, PrefillID: pf.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
	if err != nil || out != registry.OutcomeQuarantined || got.State != registry.StateReady {
		t.Fatalf("failure on trial: %s, state %s, %v; want quarantined, decode ready", out, got.State, err)
	}
	q2 := oneQuarantine(t, s)
	if q2.Trial || q2.ExpiresAt == nil || !strings.Contains(q2.Detail, "on trial") {
		t.Fatalf("re-quarantine: %+v", q2)
	}
	if k := lastKind(t, s, d.ID); k != registry.EventQuarantined {
		t.Fatalf("last event %s, want %s", k, registry.EventQuarantined)
	}
	// Expired again; this time the transfer succeeds: the quarantine ends.
	if n, err := s.ExpireQuarantines(ctx(t), q2.ExpiresAt.Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("second expiry: %d, %v", n, err)
	}
	if lifted, err := s.ReportTransferSuccess(ctx(t), pf.ID, d.ID, "router:test"); err != nil || !lifted {
		t.Fatalf("success on trial: %v, %v; want lifted", lifted, err)
	}
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 0 {
		t.Fatalf("quarantine kept after a success on trial: %+v", qs)
	}
	if k := lastKind(t, s, d.ID); k != registry.EventQuarantineLifted {
		t.Fatalf("last event %s, want %s", k, registry.EventQuarantineLifted)
	}
	if lifted, err := s.ReportTransferSuccess(ctx(t), pf.ID, d.ID, "router:test"); err != nil || lifted {
		t.Fatalf("success without a quarantine: %v, %v", lifted, err)
	}
}

func testQuarantineLift(t *testing.T, s registry.Store) {
	pf, d, dspec := newPair(t, s)
	if err := s.LiftQuarantine(ctx(t), pf.ID, d.ID, "admin"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("lift a pair that is not quarantined: %v; want ErrNotFound", err)
	}
	quarantinePair(t, s, pf.ID, &dspec, d.ID)
	changes := s.Subscribe(ctx(t))
	if err := s.LiftQuarantine(ctx(t), pf.ID, d.ID, "admin-token"); err != nil {
		t.Fatalf("lift: %v", err)
	}
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 0 {
		t.Fatalf("quarantine kept after lift: %+v", qs)
	}
	evs, err := s.Events(ctx(t), registry.EventQuery{PeerID: d.ID, Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].Kind != registry.EventQuarantineLifted || !strings.Contains(evs[0].Message, "admin-token") {
		t.Fatalf("lift event: %+v, %v; want %s naming who lifted it", evs, err, registry.EventQuarantineLifted)
	}
	select {
	case <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("no change announced after a lift")
	}
	if d2, _ := s.Get(ctx(t), d.ID); d2.State != registry.StateReady {
		t.Fatalf("decode state after lift: %s", d2.State)
	}
	if err := s.LiftQuarantine(ctx(t), pf.ID, d.ID, "admin"); !errors.Is(err, registry.ErrNotQuarantined) {
		t.Fatalf("second lift: %v; want ErrNotQuarantined", err)
	}
	for _, ids := range [][2]string{
		{"6f1c3c55-1111-4222-8333-444455556666", d.ID},
		{pf.ID, "6f1c3c55-1111-4222-8333-444455556666"},
		{"not-a-uuid", d.ID},
	} {
		if err := s.LiftQuarantine(ctx(t), ids[0], ids[1], "admin"); !errors.Is(err, registry.ErrNotFound) || errors.Is(err, registry.ErrNotQuarantined) {
			t.Fatalf("lift %v: %v; want ErrNotFound", ids, err)
		}
	}
	// A lifted pair fails again: the repeat rule still applies.
	_, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: d.ID,
		DecodeAgent: dspec.Ranks[0].AgentName, PrefillID: pf.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
	if err != nil || out != registry.OutcomeQuarantined {
		t.Fatalf("failure after lift: %s, %v", out, err)
	}
}
