package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
)

// TestMirrorRefreshesLoads: heartbeats that change only the load announce
// no change, yet the mirror's snapshot reports the new load after a load
// refresh, without a rebuild.
func TestMirrorRefreshesLoads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memstore.New(memstore.Config{})
	m := replica.NewMirror(replica.MirrorConfig{LoadRefresh: 5 * time.Millisecond}, store, zerolog.New(zerolog.NewTestWriter(t)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := store.Register(ctx, registrytest.Spec("d0", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	hb := registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: res.Peer.InstanceID}
	if _, err := store.Heartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	var snap *replica.Snapshot
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("d0 ready in the snapshot", func() bool {
		snap = m.Snapshot()
		p, ok := snap.Peer(res.Peer.ID)
		return ok && p.State == registry.StateReady
	})
	hb.Load = registry.Load{Running: 4, Queued: 2, KVUsage: 0.5}
	if _, err := store.Heartbeat(ctx, hb); err != nil {
		t.Fatal(err)
	}
	p, _ := snap.Peer(res.Peer.ID)
	waitFor("the new load", func() bool {
		l, ok := snap.Load(p)
		return ok && l.Load == hb.Load
	})
	if m.Snapshot() != snap {
		t.Fatalf("a load-only heartbeat rebuilt the snapshot")
	}
	// The router keeps the record's load and asks for a newer one.
	if l, ok := snap.NewerLoad(p.ReportedLoad()); !ok || l.Load != hb.Load {
		t.Fatalf("NewerLoad of the record's load = %+v, %t; want the refreshed %+v", l.Load, ok, hb.Load)
	}
}
