package registrytest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// StoreFactory opens a fresh, empty store for one test. Stores must use a
// lease TTL of registry.DefaultLeaseTTL, a quarantine TTL of
// QuarantineTTL and the heal config Heal.
type StoreFactory func(t *testing.T) registry.Store

// RunContract runs the registry.Store contract suite against the stores that
// newStore opens. Every store must pass it unchanged.
func RunContract(t *testing.T, newStore StoreFactory) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s registry.Store)
	}{
		{"RegisterNew", testRegisterNew},
		{"RoundTripGeometry", testRoundTrip},
		{"RoundTripProvenance", testRoundTripProvenance},
		{"ReregisterKeepsID", testReregister},
		{"HeartbeatTurnsReady", testHeartbeat},
		{"HeartbeatUnknownPeer", testHeartbeatUnknown},
		{"EngineDownAndBack", testEngineDown},
		{"LoadsFollowHeartbeats", testLoads},
		{"StaleAndReregister", testStale},
		{"HealActionFails", testHealActionFails},
		{"DrainAndDelete", testDrainDelete},
		{"ListFilters", testList},
		{"LeaseExpiry", testExpiry},
		{"LeaseGrace", testLeaseGrace},
		{"EventsPaging", testEvents},
		{"SubscribeAnnouncesChanges", testSubscribe},
		{"Quarantine", testQuarantine},
		{"QuarantineTrial", testQuarantineTrial},
		{"QuarantineLift", testQuarantineLift},
		{"HealHoldsThePair", testHealHold},
		{"TransferFailures", testTransferFailures},
		{"ConcurrentHeartbeats", testConcurrentHeartbeats},
		{"RefusesBadFields", testRefusesBadFields},
		{"MalformedHeartbeatFlood", testMalformedHeartbeatFlood},
		{"Credentials", testCredentials},
		{"CredentialBoundToRoleAndModel", testCredentialBinding},
		{"AgentNamesUniqueAcrossLivePeers", testAgentNamesUnique},
		{"TransferSecretRoundTrip", testTransferSecret},
		{"Preflight", testPreflight},
		{"Probe", testProbe},
		{"Exchanges", testExchanges},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustRegister(t *testing.T, s registry.Store, spec registry.PeerSpec) registry.RegisterResult {
	t.Helper()
	res, err := s.Register(ctx(t), spec, registry.Claim{Admin: true})
	if err != nil {
		t.Fatalf("register %s: %v", spec.Name, err)
	}
	return res
}

func mustHeartbeat(t *testing.T, s registry.Store, p registry.Peer) registry.HeartbeatReply {
	t.Helper()
	r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, Load: registry.Load{Running: 3, Queued: 1, KVUsage: 0.25}})
	if err != nil {
		t.Fatalf("heartbeat %s: %v", p.Name, err)
	}
	return r
}

// idleHeartbeat is a heartbeat of an engine with nothing in flight.
func idleHeartbeat(t *testing.T, s registry.Store, p registry.Peer) registry.HeartbeatReply {
	t.Helper()
	r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID})
	if err != nil {
		t.Fatalf("heartbeat %s: %v", p.Name, err)
	}
	return r
}

// toldToHeal marks p stale (a transfer failed) and checks that its next
// idle heartbeat is told to heal.
func toldToHeal(t *testing.T, s registry.Store, p registry.Peer) {
	t.Helper()
	if _, err := s.MarkStale(ctx(t), p.ID, "transfer failed", ""); err != nil {
		t.Fatal(err)
	}
	if r := idleHeartbeat(t, s, p); r.Action != registry.ActionHeal {
		t.Fatalf("idle heartbeat of %s after the stale mark: %+v, want heal", p.Name, r)
	}
}

func mustGet(t *testing.T, s registry.Store, id string) registry.Peer {
	t.Helper()
	p, err := s.Get(ctx(t), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return p
}

func kinds(t *testing.T, s registry.Store, id string) []registry.EventKind {
	t.Helper()
	evs, err := s.Events(ctx(t), registry.EventQuery{PeerID: id, Limit: 100})
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	out := make([]registry.EventKind, len(evs))
	for i := range evs {
		out[len(evs)-1-i] = evs[i].Kind // oldest first
	}
	return out
}

func testRegisterNew(t *testing.T, s registry.Store) {
	res := mustRegister(t, s, Spec("p0", registry.RolePrefill))
	p := res.Peer
	if !res.Created || p.ID == "" || p.Generation != 1 || p.State != registry.StatePending {
		t.Fatalf("new peer: created=%v id=%q gen=%d state=%s", res.Created, p.ID, p.Generation, p.State)
	}
	if !p.LeaseExpiry.After(p.CreatedAt) {
		t.Fatalf("lease %v not after creation %v", p.LeaseExpiry, p.CreatedAt)
	}
	if got := kinds(t, s, p.ID); !reflect.DeepEqual(got, []registry.EventKind{registry.EventRegistered}) {
		t.Fatalf("events = %v", got)
	}
}

func testRoundTrip(t *testing.T, s registry.Store) {
	spec := Spec("p0", registry.RolePrefill)
	spec.Labels = map[string]string{"zone": "a", "<b>": "x"}
	spec.TransferGroup = "g1"
	spec.BootstrapHost = "10.0.0.1"
	spec.KVEvents = registry.KVEvents{Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558", Topic: "kv@p0"}
	spec.Parallelism = registry.Parallelism{TPSize: 4, AttnTPSize: 2, DPSize: 2, PPSize: 2, PPRank: 1, DCPSize: 1}
	meta := make([]byte, 1<<20)
	for i := range meta {
		meta[i] = byte(i * 7)
	}
	spec.Ranks = append(spec.Ranks, registry.Rank{
		Rank: 1, GPUID: 1, AgentName: "p0-agent-1", AgentMetadata: meta,
		KVDataPtrs:  []uint64{1 << 63, 0xffff_0000_0000_0000, 0x1000},
		KVDataLens:  []uint64{4096, 8192, 1 << 40},
		KVItemLens:  []uint64{64, 128, 4096},
		KVMemKinds:  []registry.MemKind{registry.DRAM, registry.VRAM, registry.FILE},
		AuxDataPtrs: []uint64{0x2000}, AuxDataLens: []uint64{64},
	})
	p := mustRegister(t, s, spec).Peer
	got := mustGet(t, s, p.ID)
	if !reflect.DeepEqual(got.PeerSpec, spec) {
		t.Fatalf("spec did not round-trip:\n got %+v\nwant %+v", got.PeerSpec, spec)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("Get differs from Register's answer:\n got %+v\nwant %+v", got, p)
	}
}

// testRoundTripProvenance pins that a peer registered from what a stock
// engine publishes keeps its observed and unknown lists and no ranks, and
// that a later declared registration replaces them.
func testRoundTripProvenance(t *testing.T, s registry.Store) {
	spec := PublishedSpec("d0", registry.RoleDecode)
	p := mustRegister(t, s, spec).Peer
	got := mustGet(t, s, p.ID)
	if !reflect.DeepEqual(got.PeerSpec, spec) {
		t.Fatalf("published spec did not round-trip:\n got %+v\nwant %+v", got.PeerSpec, spec)
	}
	if got.Ranks != nil || got.Provenance("ranks") != registry.Unknown || got.Provenance("model") != registry.Observed ||
		got.Provenance("name") != registry.Declared {
		t.Fatalf("provenance: ranks %v (%s), model %s, name %s", got.Ranks, got.Provenance("ranks"),
			got.Provenance("model"), got.Provenance("name"))
	}
	declared := Spec("d0", registry.RoleDecode)
	again := mustRegister(t, s, declared).Peer
	if got := mustGet(t, s, p.ID); !reflect.DeepEqual(got.PeerSpec, declared) || again.Generation != p.Generation+1 {
		t.Fatalf("declared re-registration: gen %d (was %d), spec %+v", again.Generation, p.Generation, got.PeerSpec)
	}
}

func testReregister(t *testing.T, s registry.Store) {
	first := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	same := mustRegister(t, s, Spec("d0", registry.RoleDecode))
	if same.Created || same.Peer.ID != first.ID || same.Peer.Generation != 1 {
		t.Fatalf("identical re-registration: created=%v id=%s gen=%d", same.Created, same.Peer.ID, same.Peer.Generation)
	}
	spec := Spec("d0", registry.RoleDecode)
	spec.InstanceID = "restarted"
	if p := mustRegister(t, s, spec).Peer; p.ID != first.ID || p.Generation != 2 {
		t.Fatalf("new instance: id=%s gen=%d, want same id, gen 2", p.ID, p.Generation)
	}
	spec.Ranks[0].AgentName = "fresh-agent"
	if p := mustRegister(t, s, spec).Peer; p.Generation != 3 {
		t.Fatalf("new agent name: gen=%d, want 3", p.Generation)
	}
	spec.URL = "http://127.0.0.1:31000"
	if p := mustRegister(t, s, spec).Peer; p.Generation != 3 || p.URL != spec.URL {
		t.Fatalf("changed url only: gen=%d url=%s, want gen 3 and the new url", p.Generation, p.URL)
	}
}

func testHeartbeat(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	if r := mustHeartbeat(t, s, p); r.Action != registry.ActionNone || r.State != registry.StateReady {
		t.Fatalf("first heartbeat: %+v", r)
	}
	got := mustGet(t, s, p.ID)
	if got.State != registry.StateReady || got.LastHeartbeat == nil || got.Load.Running != 3 || got.Load.KVUsage != 0.25 {
		t.Fatalf("after heartbeat: state=%s hb=%v load=%+v", got.State, got.LastHeartbeat, got.Load)
	}
	mustHeartbeat(t, s, p)
	if k := kinds(t, s, p.ID); !reflect.DeepEqual(k, []registry.EventKind{registry.EventRegistered, registry.EventReady}) {
		t.Fatalf("events = %v (a second heartbeat must not log)", k)
	}
	r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: "someone-else"})
	if err != nil || r.Action != registry.ActionReregister {
		t.Fatalf("heartbeat from another instance: %+v, %v; want reregister", r, err)
	}
}

func testHeartbeatUnknown(t *testing.T, s registry.Store) {
	for _, id := range []string{"6f1c3c55-1111-4222-8333-444455556666", "not-a-uuid", "6f1c3c55-1111-4222-8333-44445555666\x00", "\xff"} {
		_, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: id, InstanceID: "x"})
		if !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("heartbeat of unknown %q: %v, want ErrNotFound", id, err)
		}
		if _, err := s.Get(ctx(t), id); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("get unknown %q: %v, want ErrNotFound", id, err)
		}
		if _, err := s.MarkStale(ctx(t), id, "r", "e"); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("stale unknown %q: %v, want ErrNotFound", id, err)
		}
	}
}

func testStale(t *testing.T, s registry.Store) {
	spec := Spec("d0", registry.RoleDecode)
	p := mustRegister(t, s, spec).Peer
	mustHeartbeat(t, s, p)
	const msg = "Missing NIXL destination KV memory kind"
	st, err := s.MarkStale(ctx(t), p.ID, "transfer failed", msg)
	if err != nil || st.State != registry.StateStale || st.StateReason != "transfer failed" {
		t.Fatalf("mark stale: %+v, %v", st, err)
	}
	if st.Heal.Phase != registry.HealDraining || st.Heal.FromGeneration != 1 {
		t.Fatalf("the stale mark starts no heal plan: %+v", st.Heal)
	}
	// A busy engine drains; an idle one is drained: the agent is told to
	// heal, once.
	if r := mustHeartbeat(t, s, p); r.Action != registry.ActionNone || r.State != registry.StateStale {
		t.Fatalf("heartbeat of a stale busy peer: %+v, want none", r)
	}
	if r := idleHeartbeat(t, s, p); r.Action != registry.ActionHeal || r.State != registry.StateStale || r.Reason != "transfer failed" {
		t.Fatalf("heartbeat of a stale idle peer: %+v, want heal", r)
	}
	for i := 0; i < 3; i++ {
		if r := idleHeartbeat(t, s, p); r.Action != registry.ActionNone || r.State != registry.StateStale {
			t.Fatalf("heartbeat %d after the heal instruction: %+v, want none", i+1, r)
		}
	}
	if got, err := s.Get(ctx(t), p.ID); err != nil || got.Heal.Phase != registry.HealVerifying || got.Heal.Acted.IsZero() {
		t.Fatalf("verifying: %+v, %v", got.Heal, err)
	}
	// Re-registering under the same agent name does not clear the mark.
	if q := mustRegister(t, s, spec).Peer; q.State != registry.StateStale || q.StateReason != registry.ReasonSameAgentName || q.Generation != 1 {
		t.Fatalf("same-name re-registration: state=%s reason=%q gen=%d", q.State, q.StateReason, q.Generation)
	}
	spec.Ranks[0].AgentName = "d0-agent-fresh"
	q := mustRegister(t, s, spec).Peer
	if q.State != registry.StateReady || q.Generation != 2 || q.ID != p.ID {
		t.Fatalf("fresh-name re-registration: state=%s gen=%d", q.State, q.Generation)
	}
	if q.Heal.Active() || len(q.Heal.Recent) != 1 {
		t.Fatalf("healed peer keeps a plan: %+v", q.Heal)
	}
	want := []registry.EventKind{registry.EventRegistered, registry.EventReady, registry.EventStale,
		registry.EventHealStarted, registry.EventHealActing, registry.EventRegistered, registry.EventReregistered, registry.EventHealed}
	if k := kinds(t, s, p.ID); !reflect.DeepEqual(k, want) {
		t.Fatalf("events = %v, want %v", k, want)
	}
	evs, _ := s.Events(ctx(t), registry.EventQuery{PeerID: p.ID, Limit: 100})
	for _, e := range evs {
		if e.Kind == registry.EventStale && e.Error != msg {
			t.Fatalf("stale event error = %q, want %q", e.Error, msg)
		}
	}
}

// testHealActionFails: an agent that reports its heal action failed gets
// its peer failed, with the action's output as the reason; no further
// instruction follows.
func testHealActionFails(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("d1", registry.RoleDecode)).Peer
	mustHeartbeat(t, s, p)
	toldToHeal(t, s, p)
	r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, HealError: "systemctl: Unit sglang-d1.service not found.\nexit status 5"})
	if err != nil || r.Action != registry.ActionNone || r.State != registry.StateFailed {
		t.Fatalf("heal error: %+v, %v", r, err)
	}
	got, err := s.Get(ctx(t), p.ID)
	if err != nil || got.State != registry.StateFailed || !strings.Contains(got.StateReason, "not found") || got.Heal.Active() {
		t.Fatalf("failed peer: %+v, %v", got, err)
	}
	if k := kinds(t, s, p.ID); k[len(k)-1] != registry.EventHealFailed {
		t.Fatalf("events %v", k)
	}
}

func testDrainDelete(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	mustHeartbeat(t, s, p)
	d, err := s.Drain(ctx(t), p.ID)
	if err != nil || d.State != registry.StateDraining {
		t.Fatalf("drain: %+v, %v", d.State, err)
	}
	if r := mustHeartbeat(t, s, p); r.State != registry.StateDraining {
		t.Fatalf("heartbeat must not undrain: %+v", r)
	}
	if err := s.Delete(ctx(t), p.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := s.Get(ctx(t), p.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := s.Delete(ctx(t), p.ID); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if k := kinds(t, s, p.ID); k[len(k)-1] != registry.EventRemoved {
		t.Fatalf("events after delete = %v", k)
	}
	// The name is free again and gets a new ID.
	if q := mustRegister(t, s, Spec("p0", registry.RolePrefill)); !q.Created || q.Peer.ID == p.ID {
		t.Fatalf("re-create after delete: created=%v id=%s", q.Created, q.Peer.ID)
	}
}

func testList(t *testing.T, s registry.Store) {
	both := Spec("b0", registry.RoleBoth)
	other := Spec("d1", registry.RoleDecode)
	other.Model = "other"
	var ps []registry.Peer
	for _, spec := range []registry.PeerSpec{Spec("p0", registry.RolePrefill), Spec("d0", registry.RoleDecode), both, other} {
		ps = append(ps, mustRegister(t, s, spec).Peer)
	}
	mustHeartbeat(t, s, ps[1])
	names := func(f registry.Filter) []string {
		peers, err := s.List(ctx(t), f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		out := []string{}
		for _, p := range peers {
			out = append(out, p.Name)
		}
		return out
	}
	for _, tc := range []struct {
		f    registry.Filter
		want []string
	}{
		{registry.Filter{}, []string{"b0", "d0", "d1", "p0"}},
		{registry.Filter{Role: registry.RolePrefill}, []string{"b0", "p0"}},
		{registry.Filter{Role: registry.RoleDecode}, []string{"b0", "d0", "d1"}},
		{registry.Filter{Role: registry.RoleBoth}, []string{"b0"}},
		{registry.Filter{State: registry.StateReady}, []string{"d0"}},
		{registry.Filter{Model: "other"}, []string{"d1"}},
		{registry.Filter{Model: "none"}, []string{}},
	} {
		if got := names(tc.f); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("list %+v = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// testEngineDown: heartbeats from an agent whose engine fails its probes
// move the peer to unhealthy (with the probe error as the reason, once) and
// back to ready when the engine answers again; the lease still applies.
func testEngineDown(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	down := func() registry.HeartbeatReply {
		t.Helper()
		r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, EngineDown: true, EngineError: "GET /health: connection refused"})
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		return r
	}
	// A pending peer whose engine is already down never becomes ready.
	if r := down(); r.State != registry.StateUnhealthy || r.Action != registry.ActionNone {
		t.Fatalf("first heartbeat with the engine down: %+v, want unhealthy and no action", r)
	}
	got := mustGet(t, s, p.ID)
	if got.State != registry.StateUnhealthy || got.StateReason != "engine unhealthy: GET /health: connection refused" {
		t.Fatalf("peer: state=%s reason=%q", got.State, got.StateReason)
	}
	if r := down(); r.State != registry.StateUnhealthy {
		t.Fatalf("second heartbeat with the engine down: %+v", r)
	}
	if r := mustHeartbeat(t, s, p); r.State != registry.StateReady {
		t.Fatalf("heartbeat with the engine back: %+v, want ready", r)
	}
	if got := mustGet(t, s, p.ID); got.State != registry.StateReady || got.StateReason != "" || got.Load.Running != 3 {
		t.Fatalf("peer after recovery: state=%s reason=%q load=%+v", got.State, got.StateReason, got.Load)
	}
	if r := down(); r.State != registry.StateUnhealthy {
		t.Fatalf("ready peer, engine down: %+v", r)
	}
	want := []registry.EventKind{registry.EventRegistered, registry.EventUnhealthy, registry.EventReady, registry.EventUnhealthy}
	if k := kinds(t, s, p.ID); !reflect.DeepEqual(k, want) {
		t.Fatalf("events = %v, want %v", k, want)
	}
	evs, err := s.Events(ctx(t), registry.EventQuery{PeerID: p.ID, Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].Error != "GET /health: connection refused" {
		t.Fatalf("newest event: %+v, %v; want the probe error", evs, err)
	}
	// An unhealthy peer's agent is alive only while it heartbeats.
	if n, err := s.ExpireLeases(ctx(t), time.Now().Add(registry.DefaultLeaseTTL+time.Minute)); err != nil || n != 1 {
		t.Fatalf("expire an unhealthy peer: %d, %v; want 1", n, err)
	}
	// Draining wins over the engine's health either way.
	d, err := s.Drain(ctx(t), p.ID)
	if err != nil || d.State != registry.StateDraining {
		t.Fatalf("drain: %+v, %v", d, err)
	}
	if r := down(); r.State != registry.StateDraining {
		t.Fatalf("drained peer, engine down: %+v", r)
	}
}

// testLoads: Loads holds what the last heartbeat of each peer reported,
// and nothing for a peer that never heartbeated.
func testLoads(t *testing.T, s registry.Store) {
	d0 := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	mustRegister(t, s, Spec("d1", registry.RoleDecode))
	if _, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: d0.ID, InstanceID: d0.InstanceID, Load: registry.Load{Running: 1, Queued: 2, KVUsage: 0.5}}); err != nil {
		t.Fatal(err)
	}
	mustHeartbeat(t, s, d0) // running 3, queued 1, usage 0.25
	loads, err := s.Loads(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, s, d0.ID)
	want := []registry.PeerLoad{{PeerID: d0.ID, Load: registry.Load{Running: 3, Queued: 1, KVUsage: 0.25}, At: *got.LastHeartbeat}}
	if len(loads) != 1 || loads[0].PeerID != want[0].PeerID || loads[0].Load != want[0].Load || !loads[0].At.Equal(want[0].At) {
		t.Fatalf("Loads() = %+v, want %+v", loads, want)
	}
}

func testExpiry(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	mustHeartbeat(t, s, p)
	if n, err := s.ExpireLeases(ctx(t), time.Now()); err != nil || n != 0 {
		t.Fatalf("expire before the lease ends: %d, %v", n, err)
	}
	later := time.Now().Add(registry.DefaultLeaseTTL + time.Minute)
	if n, err := s.ExpireLeases(ctx(t), later); err != nil || n != 1 {
		t.Fatalf("expire after the lease: %d, %v; want 1", n, err)
	}
	if got := mustGet(t, s, p.ID); got.State != registry.StateFailed || got.StateReason != registry.ReasonLeaseExpired {
		t.Fatalf("expired peer: state=%s reason=%q", got.State, got.StateReason)
	}
	if n, _ := s.ExpireLeases(ctx(t), later); n != 0 {
		t.Fatalf("a failed peer expired again: %d", n)
	}
	if r := mustHeartbeat(t, s, p); r.State != registry.StateReady {
		t.Fatalf("heartbeat after expiry: %+v, want ready again", r)
	}
	if k := kinds(t, s, p.ID); !reflect.DeepEqual(k, []registry.EventKind{registry.EventRegistered, registry.EventReady, registry.EventExpired, registry.EventReady}) {
		t.Fatalf("events = %v", k)
	}
}

// testLeaseGrace: a grace granted long after every lease ran out keeps live
// peers from expiring for one TTL from the grant, and no longer; it leaves
// failed and draining peers, their states and their events alone.
func testLeaseGrace(t *testing.T, s registry.Store) {
	live := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	mustHeartbeat(t, s, live)
	pending := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	drained := mustRegister(t, s, Spec("d1", registry.RoleDecode)).Peer
	if _, err := s.Drain(ctx(t), drained.ID); err != nil {
		t.Fatal(err)
	}
	failed := mustRegister(t, s, Spec("d2", registry.RoleDecode)).Peer
	if n, err := s.ExpireLeases(ctx(t), time.Now().Add(registry.DefaultLeaseTTL+time.Minute)); err != nil || n != 3 {
		t.Fatalf("expire to set up a failed peer: %d, %v; want 3", n, err)
	}
	mustHeartbeat(t, s, live)
	mustRegister(t, s, Spec("d0", registry.RoleDecode)) // pending again, with a fresh lease
	before := map[string][]registry.EventKind{}
	for _, p := range []registry.Peer{live, pending, drained, failed} {
		before[p.ID] = kinds(t, s, p.ID)
	}

	grant := time.Now().Add(time.Hour) // every lease ran out long ago
	n, err := s.GrantLeaseGrace(ctx(t), grant)
	if err != nil || n != 2 {
		t.Fatalf("grant: %d, %v; want the 2 live peers", n, err)
	}
	for _, p := range []registry.Peer{live, pending} {
		got := mustGet(t, s, p.ID)
		if want := grant.UTC().Truncate(time.Microsecond).Add(registry.DefaultLeaseTTL); !got.LeaseExpiry.Equal(want) {
			t.Errorf("%s lease after the grace = %s, want %s", got.Name, got.LeaseExpiry, want)
		}
	}
	if n, err := s.ExpireLeases(ctx(t), grant.Add(registry.DefaultLeaseTTL-time.Second)); err != nil || n != 0 {
		t.Fatalf("expire within the grace: %d, %v; want 0", n, err)
	}
	if n, err := s.GrantLeaseGrace(ctx(t), grant.Add(-time.Minute)); err != nil || n != 0 {
		t.Fatalf("an earlier grant shortened %d leases (%v); leases only grow", n, err)
	}
	for _, p := range []registry.Peer{live, pending, drained, failed} {
		if got := kinds(t, s, p.ID); !reflect.DeepEqual(got, before[p.ID]) {
			t.Errorf("%s: the grace logged events %v, had %v", p.Name, got, before[p.ID])
		}
	}
	for id, want := range map[string]registry.State{live.ID: registry.StateReady, pending.ID: registry.StatePending,
		drained.ID: registry.StateDraining, failed.ID: registry.StateFailed} {
		if got := mustGet(t, s, id); got.State != want {
			t.Errorf("%s after the grace: %s, want %s", got.Name, got.State, want)
		}
	}
	if n, err := s.ExpireLeases(ctx(t), grant.Add(registry.DefaultLeaseTTL+time.Second)); err != nil || n != 2 {
		t.Fatalf("expire after the grace: %d, %v; want the 2 peers that never heartbeat again", n, err)
	}
}

func testEvents(t *testing.T, s registry.Store) {
	for i := 0; i < 5; i++ {
		mustRegister(t, s, Spec(fmt.Sprintf("p%d", i), registry.RolePrefill))
	}
	page1, err := s.Events(ctx(t), registry.EventQuery{Limit: 3})
	if err != nil || len(page1) != 3 {
		t.Fatalf("page 1: %d events, %v", len(page1), err)
	}
	if page1[0].ID <= page1[1].ID || page1[0].PeerName != "p4" {
		t.Fatalf("page 1 is not newest first: %+v", page1)
	}
	page2, err := s.Events(ctx(t), registry.EventQuery{Limit: 3, Before: page1[2].ID})
	if err != nil || len(page2) != 2 || page2[0].ID >= page1[2].ID {
		t.Fatalf("page 2: %+v, %v", page2, err)
	}
	after, err := s.Events(ctx(t), registry.EventQuery{After: page2[0].ID, Limit: 10})
	if err != nil || len(after) != 3 || after[0].ID <= page2[0].ID || after[0].ID >= after[1].ID {
		t.Fatalf("after cursor: %+v, %v", after, err)
	}
	// Cursors are bigint ids: one past int32 is a cursor like any other.
	top, err := s.Events(ctx(t), registry.EventQuery{Limit: 3, Before: math.MaxInt64, PeerID: page1[0].PeerID})
	if err != nil || len(top) != 1 || top[0].ID != page1[0].ID {
		t.Fatalf("before the largest id: %+v, %v; want the newest event", top, err)
	}
	if none, err := s.Events(ctx(t), registry.EventQuery{After: math.MaxInt32 + 1, Limit: 3}); err != nil || len(none) != 0 {
		t.Fatalf("after an id past int32: %+v, %v; want nothing", none, err)
	}
}

func testSubscribe(t *testing.T, s registry.Store) {
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	changes := s.Subscribe(c)
	p := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	waitFor := func(what string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case ch := <-changes:
				if ch.ReloadAll() {
					return
				}
				for _, id := range ch.PeerIDs {
					if id == p.ID {
						return
					}
				}
			case <-deadline:
				t.Fatalf("no change announced after %s", what)
			}
		}
	}
	waitFor("register")
	if _, err := s.MarkStale(ctx(t), p.ID, "r", "e"); err != nil {
		t.Fatal(err)
	}
	waitFor("mark stale")
}

// newPair registers prefill p0 and decode d0 on s and heartbeats the
// decode; it returns both peers and the decode's spec, which quarantinePair
// re-registers.
func newPair(t *testing.T, s registry.Store) (pf, d registry.Peer, dspec registry.PeerSpec) {
	t.Helper()
	pf = mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	dspec = Spec("d0", registry.RoleDecode)
	d = mustRegister(t, s, dspec).Peer
	mustHeartbeat(t, s, d)
	return pf, d, dspec
}

// quarantinePair drives the pair into quarantine the only way the product
// does: a failed transfer, a re-registration under a fresh agent, and the
// same failure again.
func quarantinePair(t *testing.T, s registry.Store, prefillID string, dspec *registry.PeerSpec, decodeID string) {
	t.Helper()
	report := func() registry.TransferOutcome {
		_, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: decodeID,
			DecodeAgent: dspec.Ranks[0].AgentName, PrefillID: prefillID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"})
		if err != nil {
			t.Fatalf("report: %v", err)
		}
		return out
	}
	if out := report(); out != registry.OutcomeStale {
		t.Fatalf("first failure: %s", out)
	}
	dspec.Ranks[0].AgentName += "-g2"
	mustRegister(t, s, *dspec)
	if out := report(); out != registry.OutcomeQuarantined {
		t.Fatalf("repeat after re-registration: %s", out)
	}
}

func testQuarantine(t *testing.T, s registry.Store) {
	pf, d, dspec := newPair(t, s)
	quarantinePair(t, s, pf.ID, &dspec, d.ID)
	qs, err := s.Quarantines(ctx(t))
	if err != nil || len(qs) != 1 || qs[0].PrefillID != pf.ID || qs[0].DecodeID != d.ID ||
		!strings.Contains(qs[0].Detail, "Missing NIXL destination KV memory kind") || qs[0].At.IsZero() {
		t.Fatalf("quarantines: %+v, %v", qs, err)
	}
	if k := kinds(t, s, d.ID); k[len(k)-1] != registry.EventQuarantined {
		t.Fatalf("events = %v", k)
	}
	// A new agent name alone keeps the quarantine: the geometry is the same.
	dspec.Ranks[0].AgentName = "d0-fresh"
	mustRegister(t, s, dspec)
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 1 {
		t.Fatalf("quarantine cleared by a same-geometry re-registration")
	}
	// A changed geometry clears it.
	dspec.Ranks[0].KVMemKinds = []registry.MemKind{registry.DRAM, registry.DRAM}
	mustRegister(t, s, dspec)
	if qs, _ := s.Quarantines(ctx(t)); len(qs) != 0 {
		t.Fatalf("quarantine kept after the geometry changed: %+v", qs)
	}
	bad := registry.TransferFailure{PrefillID: pf.ID, DecodeID: "6f1c3c55-1111-4222-8333-444455556666", Reason: "transfer failed"}
	if _, _, err := s.ReportTransferFailure(ctx(t), bad); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("failure report about an unknown decode: %v", err)
	}
}

func testConcurrentHeartbeats(t *testing.T, s registry.Store) {
	const n = 200
	peers := make([]registry.Peer, n)
	for i := range peers {
		peers[i] = mustRegister(t, s, Spec(fmt.Sprintf("p%03d", i), registry.RolePrefill)).Peer
	}
	var wg sync.WaitGroup
	errs := make(chan error, n*3)
	for round := 0; round < 3; round++ {
		for i := range peers {
			wg.Add(1)
			go func(p registry.Peer) {
				defer wg.Done()
				r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID})
				if err == nil && (r.Action != registry.ActionNone || r.State != registry.StateReady) {
					err = fmt.Errorf("peer %s: reply %+v", p.Name, r)
				}
				if err != nil {
					errs <- err
				}
			}(peers[i])
		}
	}
	wg.Wait()
	wantReadyAfter(t, s, errs, n)
}

// wantReadyAfter reports every error the test's goroutines sent on errs
// (all of them have returned), then checks that exactly want peers are
// ready.
func wantReadyAfter(t *testing.T, s registry.Store, errs chan error, want int) {
	t.Helper()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ready, err := s.List(ctx(t), registry.Filter{State: registry.StateReady})
	if err != nil || len(ready) != want {
		t.Fatalf("ready peers: %d, %v; want %d", len(ready), err, want)
	}
}

func testTransferFailures(t *testing.T, s registry.Store) {
	p0 := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	p1 := mustRegister(t, s, Spec("p1", registry.RolePrefill)).Peer
	dspec := Spec("d0", registry.RoleDecode)
	d := mustRegister(t, s, dspec).Peer
	mustHeartbeat(t, s, d)
	const msg = "RuntimeError: Missing NIXL destination KV memory kind"
	report := func(agent, prefill string) (registry.Peer, registry.TransferOutcome) {
		t.Helper()
		got, out, err := s.ReportTransferFailure(ctx(t), registry.TransferFailure{
			DecodeID: d.ID, DecodeAgent: agent, PrefillID: prefill, Reason: "transfer failed", Error: msg})
		if err != nil {
			t.Fatalf("report: %v", err)
		}
		return got, out
	}
	if got, out := report("d0-agent-0", p0.ID); out != registry.OutcomeStale || got.State != registry.StateStale {
		t.Fatalf("first failure: %s, state %s", out, got.State)
	}
	if _, out := report("d0-agent-0", p0.ID); out != registry.OutcomeAlreadyStale {
		t.Fatalf("duplicate report: %s", out)
	}
	dspec.Ranks[0].AgentName = "d0-agent-fresh"
	if q := mustRegister(t, s, dspec).Peer; q.State != registry.StateReady || q.Generation != 2 {
		t.Fatalf("re-registration: %s gen %d", q.State, q.Generation)
	}
	if got, out := report("d0-agent-0", p0.ID); out != registry.OutcomeOutdated || got.State != registry.StateReady {
		t.Fatalf("late report about the old agent: %s, state %s", out, got.State)
	}
	got, out := report("d0-agent-fresh", p0.ID)
	if out != registry.OutcomeQuarantined || got.State != registry.StateReady {
		t.Fatalf("repeat after re-registration: %s, state %s; want the pair quarantined and the decode left ready", out, got.State)
	}
	qs, _ := s.Quarantines(ctx(t))
	if len(qs) != 1 || qs[0].PrefillID != p0.ID || qs[0].DecodeID != d.ID || !strings.Contains(qs[0].Detail, "geometry") {
		t.Fatalf("quarantines = %+v", qs)
	}
	// Another prefill has no history with this decode: a plain stale mark.
	if _, out := report("d0-agent-fresh", p1.ID); out != registry.OutcomeStale {
		t.Fatalf("failure from another prefill: %s", out)
	}
	if n := CountKinds(kinds(t, s, d.ID), registry.EventStale); n != 2 {
		t.Fatalf("%d stale events, want 2 (duplicates and outdated reports log nothing)", n)
	}
}

// CountKinds is how many of ks are k.
func CountKinds(ks []registry.EventKind, k registry.EventKind) int {
	n := 0
	for _, x := range ks {
		if x == k {
			n++
		}
	}
	return n
}

// wantFieldError fails unless err is the *registry.FieldError on field.
func wantFieldError(t *testing.T, what string, err error, field string) {
	t.Helper()
	var fe *registry.FieldError
	if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("%s: %v, want a FieldError on %q", what, err, field)
	}
}

// testRefusesBadFields pins that a store refuses, with the registry's
// FieldError, every value its schema could not hold or would change (NUL,
// invalid UTF-8, integers past int32), and that nothing changes: the
// embedded store refuses exactly what PostgreSQL would.
func testRefusesBadFields(t *testing.T, s registry.Store) {
	p := mustRegister(t, s, Spec("p0", registry.RolePrefill)).Peer
	mustHeartbeat(t, s, p)
	before := mustGet(t, s, p.ID)
	evsBefore := kinds(t, s, p.ID)

	specs := []struct {
		field string
		edit  func(*registry.PeerSpec)
	}{
		{"instance_id", func(sp *registry.PeerSpec) { sp.InstanceID = "i\x00" }},
		{"labels.foo", func(sp *registry.PeerSpec) { sp.Labels = map[string]string{"foo": "\x00"} }},
		{"model", func(sp *registry.PeerSpec) { sp.Model = "\xff\xfe" }},
		{"kv.num_layers", func(sp *registry.PeerSpec) { sp.KV.NumLayers = 4294967301 }},
		{"ranks[0].rank", func(sp *registry.PeerSpec) { sp.Ranks[0].Rank = 1 << 31 }},
	}
	for _, tc := range specs {
		spec := Spec("p0", registry.RolePrefill)
		tc.edit(&spec)
		_, err := s.Register(ctx(t), spec, registry.Claim{Admin: true})
		wantFieldError(t, "register with a bad "+tc.field, err, tc.field)
	}
	for _, tc := range []struct {
		field string
		hb    registry.Heartbeat
	}{
		{"instance_id", registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID + "\x00"}},
		{"instance_id", registry.Heartbeat{PeerID: p.ID, InstanceID: "\xc3("}},
		{"load.running", registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, Load: registry.Load{Running: 4294967301}}},
		{"load.queued", registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, Load: registry.Load{Queued: -1}}},
	} {
		_, err := s.Heartbeat(ctx(t), tc.hb)
		wantFieldError(t, "heartbeat with a bad "+tc.field, err, tc.field)
	}
	_, err := s.MarkStale(ctx(t), p.ID, "r\x00", "")
	wantFieldError(t, "stale mark with NUL in the reason", err, "reason")
	_, err = s.MarkStale(ctx(t), p.ID, "r", "e\xff")
	wantFieldError(t, "stale mark with invalid UTF-8 in the error", err, "error")
	_, _, err = s.ReportTransferFailure(ctx(t), registry.TransferFailure{DecodeID: p.ID, PrefillID: "p0\x00", Reason: "r"})
	wantFieldError(t, "report naming a prefill by a non-id", err, "prefill_id")
	_, err = s.List(ctx(t), registry.Filter{Model: "m\x00"})
	wantFieldError(t, "list by a model with NUL", err, "model")
	_, err = s.Events(ctx(t), registry.EventQuery{PeerID: "\x00"})
	wantFieldError(t, "events of a non-id", err, "peer_id")
	_, err = s.Events(ctx(t), registry.EventQuery{Before: -1})
	wantFieldError(t, "events before a negative id", err, "before")

	if after := mustGet(t, s, p.ID); !reflect.DeepEqual(after, before) {
		t.Errorf("refused input changed the peer:\n got %+v\nwant %+v", after, before)
	}
	if k := kinds(t, s, p.ID); !reflect.DeepEqual(k, evsBefore) {
		t.Errorf("refused input logged events: %v, want %v", k, evsBefore)
	}
	if peers, err := s.List(ctx(t), registry.Filter{}); err != nil || len(peers) != 1 {
		t.Errorf("refused registrations stored something: %d peers, %v", len(peers), err)
	}
}

// testMalformedHeartbeatFlood floods one peer with malformed heartbeats
// while every other peer heartbeats as usual: each malformed heartbeat is
// refused on its own, and every other peer's heartbeat succeeds and leaves
// it ready.
func testMalformedHeartbeatFlood(t *testing.T, s registry.Store) {
	const good, rounds, flood = 40, 3, 400
	victim := mustRegister(t, s, Spec("victim", registry.RoleDecode)).Peer
	peers := make([]registry.Peer, good)
	for i := range peers {
		peers[i] = mustRegister(t, s, Spec(fmt.Sprintf("d%02d", i), registry.RoleDecode)).Peer
	}
	bad := []registry.Heartbeat{
		{PeerID: victim.ID, InstanceID: victim.InstanceID + "\x00"},
		{PeerID: victim.ID, InstanceID: "\xff\xfe"},
		{PeerID: victim.ID, InstanceID: victim.InstanceID, Load: registry.Load{Running: 4294967301}},
		{PeerID: victim.ID, InstanceID: victim.InstanceID, Load: registry.Load{Queued: -7}},
	}
	var wg sync.WaitGroup
	errs := make(chan error, good*rounds+flood)
	start := make(chan struct{})
	for i := 0; i < flood; i++ {
		wg.Add(1)
		go func(hb registry.Heartbeat) {
			defer wg.Done()
			<-start
			if _, err := s.Heartbeat(ctx(t), hb); !errors.Is(err, registry.ErrInvalid) {
				errs <- fmt.Errorf("malformed heartbeat %+v: %v, want ErrInvalid", hb, err)
			}
		}(bad[i%len(bad)])
	}
	for round := 0; round < rounds; round++ {
		for i := range peers {
			wg.Add(1)
			go func(p registry.Peer) {
				defer wg.Done()
				<-start
				r, err := s.Heartbeat(ctx(t), registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID, Load: registry.Load{Running: 1}})
				if err == nil && r.State != registry.StateReady {
					err = fmt.Errorf("reply %+v", r)
				}
				if err != nil {
					errs <- fmt.Errorf("good heartbeat of %s: %w", p.Name, err)
				}
			}(peers[i])
		}
	}
	close(start)
	wg.Wait()
	wantReadyAfter(t, s, errs, good) // the well-behaved ones
	if v := mustGet(t, s, victim.ID); v.State != registry.StatePending || v.LastHeartbeat != nil {
		t.Fatalf("the flooded peer: state %s, last heartbeat %v; its malformed heartbeats must change nothing", v.State, v.LastHeartbeat)
	}
}

// testCredentials checks the registration rule both stores apply under
// their lock: who may take a new name, who may re-register a held one, and
// when a credential is issued, kept or revoked.
func testCredentials(t *testing.T, s registry.Store) {
	spec := Spec("d0", registry.RoleDecode)
	if _, err := s.Register(ctx(t), spec, registry.Claim{}); !errors.Is(err, registry.ErrForbidden) {
		t.Fatalf("anonymous registration of a new name: err = %v, want ErrForbidden", err)
	}
	res, err := s.Register(ctx(t), spec, registry.Claim{Join: true})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	cred := res.Credential
	if id, ok := registry.CredentialPeerID(cred); !ok || id != res.Peer.ID {
		t.Fatalf("credential %q does not name peer %s", cred, res.Peer.ID)
	}
	if got := mustGet(t, s, res.Peer.ID); !registry.CredentialMatches(got.CredentialHash, cred) {
		t.Fatal("the stored hash does not match the issued credential")
	}

	// Its own credential re-registers and keeps the credential.
	again, err := s.Register(ctx(t), spec, registry.Claim{Credential: cred})
	if err != nil || again.Credential != "" {
		t.Fatalf("re-register with own credential: credential %q, err %v", again.Credential, err)
	}

	// Another peer's credential, or a join token while the name is held,
	// cannot.
	other, err := s.Register(ctx(t), Spec("d1", registry.RoleDecode), registry.Claim{Join: true})
	if err != nil {
		t.Fatal(err)
	}
	hijack := spec
	hijack.URL = "http://10.9.9.9:1"
	for name, c := range map[string]registry.Claim{
		"another peer's credential":           {Credential: other.Credential},
		"a join token":                        {Join: true},
		"a join token and a wrong credential": {Join: true, Credential: other.Credential},
	} {
		if _, err := s.Register(ctx(t), hijack, c); !errors.Is(err, registry.ErrForbidden) {
			t.Fatalf("%s re-registered a held name: err = %v", name, err)
		}
	}
	if got := mustGet(t, s, res.Peer.ID); got.URL != spec.URL || !registry.CredentialMatches(got.CredentialHash, cred) {
		t.Fatalf("a refused registration changed the peer: url %s", got.URL)
	}

	// Once the lease ran out, a join token claims the name with a fresh
	// credential, and the old one stops matching.
	if _, err := s.ExpireLeases(ctx(t), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.Register(ctx(t), spec, registry.Claim{Join: true})
	if err != nil || claimed.Credential == "" || claimed.Credential == cred || claimed.Peer.ID != res.Peer.ID {
		t.Fatalf("claim after expiry: credential %q, id %s, err %v", claimed.Credential, claimed.Peer.ID, err)
	}
	got := mustGet(t, s, res.Peer.ID)
	if registry.CredentialMatches(got.CredentialHash, cred) || !registry.CredentialMatches(got.CredentialHash, claimed.Credential) {
		t.Fatal("after a claim, the old credential still matches or the new one does not")
	}

	// The admin token re-registers a held name and rotates the credential.
	admin, err := s.Register(ctx(t), spec, registry.Claim{Admin: true})
	if err != nil || admin.Credential == "" || admin.Credential == claimed.Credential {
		t.Fatalf("admin re-registration: credential %q, err %v", admin.Credential, err)
	}
}

// testCredentialBinding re-runs issue 31's second finding: a decode's own
// credential re-registering it as another role or model (which would widen
// the registrations it may read) is refused naming the field, and leaves
// the peer as it was; the admin token may.
func testCredentialBinding(t *testing.T, s registry.Store) {
	spec := Spec("d0", registry.RoleDecode)
	res, err := s.Register(ctx(t), spec, registry.Claim{Join: true})
	if err != nil {
		t.Fatal(err)
	}
	both := spec
	both.Role = registry.RoleBoth
	otherModel := spec
	otherModel.Model = "another-model"
	for field, next := range map[string]registry.PeerSpec{"role": both, "model": otherModel} {
		_, err := s.Register(ctx(t), next, registry.Claim{Credential: res.Credential})
		var ff *registry.ForbiddenFieldError
		if !errors.As(err, &ff) || ff.Field != field || !errors.Is(err, registry.ErrForbidden) {
			t.Fatalf("re-registering d0 with another %s under its credential: err = %v", field, err)
		}
	}
	if got := mustGet(t, s, res.Peer.ID); got.Role != registry.RoleDecode || got.Model != spec.Model || got.Generation != res.Peer.Generation {
		t.Fatalf("a refused re-registration changed d0: role %s model %s generation %d", got.Role, got.Model, got.Generation)
	}
	if _, err := s.Register(ctx(t), both, registry.Claim{Admin: true}); err != nil {
		t.Fatalf("the admin re-registers d0 as both: %v", err)
	}
}

// testAgentNamesUnique re-runs issue 31's third finding: a new peer that
// registers another live peer's NIXL agent name is refused with a conflict
// that names the holder and the rank's field, whoever asks; the holder
// keeps re-registering it; once the holder's lease ran out the name is free.
func testAgentNamesUnique(t *testing.T, s registry.Store) {
	holder := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	mustHeartbeat(t, s, holder)
	squat := Spec("d1", registry.RoleDecode)
	squat.Ranks = slices.Clone(squat.Ranks)
	squat.Ranks[0].AgentName = holder.Ranks[0].AgentName
	for name, c := range map[string]registry.Claim{"a join token": {Join: true}, "the admin token": {Admin: true}} {
		_, err := s.Register(ctx(t), squat, c)
		var taken *registry.AgentNameTakenError
		if !errors.As(err, &taken) || !errors.Is(err, registry.ErrConflict) || taken.Holder != "d0" || taken.Field != "ranks[0].agent_name" {
			t.Fatalf("d1 registers d0's agent name with %s: err = %v", name, err)
		}
	}
	if ps, err := s.List(ctx(t), registry.Filter{}); err != nil || len(ps) != 1 {
		t.Fatalf("after the refused squat: %d peers, %v", len(ps), err)
	}
	again := mustRegister(t, s, Spec("d0", registry.RoleDecode)).Peer
	if again.ID != holder.ID {
		t.Fatalf("d0 re-registered its own agent name as a new peer %s", again.ID)
	}
	if _, err := s.ExpireLeases(ctx(t), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx(t), squat, registry.Claim{Join: true}); err != nil {
		t.Fatalf("d1 takes the agent name of d0, whose lease ran out: %v", err)
	}
}

func testTransferSecret(t *testing.T, s registry.Store) {
	spec := Spec("d0", registry.RoleDecode)
	spec.Ranks[0].TransferSecret = []byte("0123456789abcdef0123456789abcdef")
	p := mustRegister(t, s, spec).Peer
	got := mustGet(t, s, p.ID)
	if string(got.Ranks[0].TransferSecret) != string(spec.Ranks[0].TransferSecret) {
		t.Fatalf("transfer secret = %q, want %q", got.Ranks[0].TransferSecret, spec.Ranks[0].TransferSecret)
	}
	// Other writes (a heartbeat, a stale mark) keep it.
	mustHeartbeat(t, s, p)
	if _, err := s.MarkStale(ctx(t), p.ID, "r", "e"); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, p.ID); string(got.Ranks[0].TransferSecret) != string(spec.Ranks[0].TransferSecret) {
		t.Fatal("the transfer secret did not survive a heartbeat and a stale mark")
	}
}

// HealExpiry checks that a store fails a peer whose heal did not verify by
// the deadline, in the lease sweep: s must hold leases far longer than its
// heal verify timeout, verify.
func HealExpiry(t *testing.T, s registry.Store, verify time.Duration) {
	t.Helper()
	p := mustRegister(t, s, Spec("d-expiry", registry.RoleDecode)).Peer
	idleHeartbeat(t, s, p)
	toldToHeal(t, s, p)
	if n, err := s.ExpireLeases(ctx(t), time.Now().Add(verify/2)); err != nil || n != 0 {
		t.Fatalf("before the deadline: %d expired, %v", n, err)
	}
	if n, err := s.ExpireLeases(ctx(t), time.Now().Add(verify+time.Second)); err != nil || n != 1 {
		t.Fatalf("after the deadline: %d expired, %v", n, err)
	}
	got := mustGet(t, s, p.ID)
	if got.State != registry.StateFailed || !strings.Contains(got.StateReason, "heal did not verify") || got.Heal.Active() {
		t.Fatalf("peer after the deadline: %s %q %+v", got.State, got.StateReason, got.Heal)
	}
	if k := kinds(t, s, p.ID); k[len(k)-1] != registry.EventHealFailed {
		t.Fatalf("events %v", k)
	}
	// Its heartbeats go on, and it stays failed: an operator acts.
	if r := idleHeartbeat(t, s, p); r.State != registry.StateFailed || r.Action != registry.ActionNone {
		t.Fatalf("heartbeat after a failed heal: %+v; want failed, no action", r)
	}
	if got := mustGet(t, s, p.ID); got.State != registry.StateFailed || !strings.Contains(got.StateReason, "heal did not verify") {
		t.Fatalf("peer after a heartbeat: %s %q; want still failed", got.State, got.StateReason)
	}
}
