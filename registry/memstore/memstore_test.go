package memstore_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// TestHeartbeatDoesNotCopyMetadata heartbeats a peer whose rank carries
// 4 MiB of NIXL agent metadata, the size real agents publish: the heartbeat
// path must not copy it. A copy is one allocation among a few, so the test
// bounds the bytes allocated per heartbeat as well as their count.
func TestHeartbeatDoesNotCopyMetadata(t *testing.T) {
	const metadata = registry.MaxAgentMetadata // the most a rank may publish
	s := memstore.New(memstore.Config{})
	spec := registrytest.Spec("d0", registry.RoleDecode)
	spec.Ranks[0].AgentMetadata = make([]byte, metadata)
	res, err := s.Register(context.Background(), spec, registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	hb := registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}
	const runs = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := s.Heartbeat(context.Background(), hb); err != nil {
			t.Fatal(err)
		}
	})
	runtime.ReadMemStats(&after)
	// AllocsPerRun makes one warm-up call besides the runs it averages.
	perBeat := (after.TotalAlloc - before.TotalAlloc) / (runs + 1)
	if perBeat >= metadata/64 {
		t.Errorf("a heartbeat allocates %d bytes with %d bytes of agent metadata registered: the metadata is copied", perBeat, metadata)
	}
	if allocs > 4 {
		t.Errorf("a heartbeat makes %.0f allocations, want at most 4", allocs)
	}
	t.Logf("per heartbeat: %.0f allocations, about %d bytes", allocs, perBeat)
}

func TestHealExpiry(t *testing.T) {
	t.Parallel()
	const verify = time.Minute
	registrytest.HealExpiry(t, memstore.New(memstore.Config{LeaseTTL: time.Hour, Heal: registry.HealConfig{VerifyTimeout: verify}}), verify)
}

// TestHoldEndsOnHeartbeat: see registrytest.CheckHoldEndsOnHeartbeat.
func TestHoldEndsOnHeartbeat(t *testing.T) {
	t.Parallel()
	var clock registrytest.Clock
	registrytest.CheckHoldEndsOnHeartbeat(t, memstore.New(memstore.Config{Now: clock.Now, Heal: registrytest.Heal}), &clock)
}
